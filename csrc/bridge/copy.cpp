// Copies between host and device, within a device and between devices, and storage growth. A device copy into
// a view is the "_pj_copy" lowering with the view as destination (dtype conversion and
// broadcasting included), so copy_ into slices, transposes or diagonals updates the base.
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>

#include <mutex>

#include "call_builder.h"
extern "C" {
#include "torch_pjrt/bucket.h"
#include "torch_pjrt/transfer.h"
}

namespace torch_pjrt {
namespace {

bool is_tpu(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }

// True when t is exactly its whole storage, row-major, and the storage holds t's dtype (or
// nothing yet): then the storage buffer itself is t's data.
bool is_whole_storage(const at::Tensor& t) {
  pj_storage_t* s = storage_of(t);
  return s && t.storage_offset() == 0 && t.is_contiguous() &&
         static_cast<size_t>(t.numel()) * t.element_size() == s->nbytes &&
         ((!s->buf && !s->pending) || s->dtype == to_pj_dtype(t.scalar_type()));
}

void device_copy(const at::Tensor& src, const at::Tensor& dst) {
  // Above PJ_MAX_RANK (a lowered call's limit) the copy runs between views without dst's
  // size-1 dims: it is elementwise, and src broadcasts to dst (copy_ checked that).
  if (dst.dim() > PJ_MAX_RANK && src.dim() <= dst.dim()) {
    const std::vector<int64_t> keep = non_unit_dims(dst.sizes());
    if (keep.size() <= PJ_MAX_RANK)
      return device_copy(without_unit_dims(src, dst.dim(), keep),
                         without_unit_dims(dst, dst.dim(), keep));
  }
  CallBuilder b("_pj_copy", "", dst.device().index() < 0 ? 0 : dst.device().index());
  b.add_tensor("src", src);
  b.add_out(dst);
  b.run();
}

// Storages up to this size are read whole when a view of them goes to the host, and the view's
// layout is gathered there (whole_storage_to_host): copying the view on the device first costs
// a program compiled for every new (shape, strides, offset), 15-80 ms each here, while moving a
// few MiB more costs well under a millisecond. PyTorch's own tests and every print of a slice
// or transpose read views at ever new shapes.
constexpr size_t kWholeStorageReadMax = size_t(4) << 20;

// The last storage contents read whole, kept from their second read on: iterating over a tpu
// tensor (`for v in t`, `all(t)`, PyTorch's tests) reads one element per step, each a read of
// the same storage, which took a device-to-host copy of the whole storage every time (60 us per
// element for a 1 MB storage here, against 2 us on CPU). (storage id, version) names one
// immutable buffer (storage.h), so the snapshot is valid exactly while both match; a write
// swaps the buffer and bumps the version. One entry: at most kWholeStorageReadMax bytes held.
// A first read keeps only the key, so a storage read once costs no copy beyond the read.
struct SnapshotKey {
  uint64_t id = 0, version = 0;
  size_t nbytes = 0;
  pj_dtype_t dt = PJ_F32;
  bool operator==(const SnapshotKey& o) const {
    return id == o.id && version == o.version && nbytes == o.nbytes && dt == o.dt;
  }
};
std::mutex snapshot_mu;
SnapshotKey snapshot_key;  // id 0 matches no storage
at::Tensor snapshot;       // the contents under snapshot_key, or undefined after one read

// Reads src's whole storage to the host and returns src's view of it there (strided), or an
// undefined tensor when that does not apply: a storage larger than kWholeStorageReadMax, or one
// whose buffer holds another element type than src's (a dtype-reinterpreting view; its device
// copy converts). `borrow`: a view served from the snapshot is the snapshot itself, for a
// caller that only reads it before returning (local_scalar); otherwise it is a copy.
at::Tensor whole_storage_to_host(const at::Tensor& src, bool borrow = false) {
  pj_storage_t* s = storage_of(src);
  const pj_dtype_t dt = to_pj_dtype(src.scalar_type());
  if (!s || s->nbytes > kWholeStorageReadMax || s->nbytes % src.element_size() != 0)
    return at::Tensor();
  // Decided before the flush: while a recorded write is pending, dtype is the type it produces,
  // and a view that falls back to the device copy must join the recorded ops (one execution).
  if ((s->buf || s->pending) && s->dtype != dt) return at::Tensor();
  check(pj_defer_flush());  // a read sees every recorded op (defer_and_fuse)
  check(pj_storage_materialize(s, dt));
  const int64_t n = static_cast<int64_t>(s->nbytes / src.element_size());
  auto view_of = [&](const at::Tensor& whole) {
    return whole.as_strided(src.sizes(), src.strides(), src.storage_offset());
  };
  const SnapshotKey key{s->id, s->version, s->nbytes, dt};
  bool again = false;  // the second read of these contents: keep them
  {
    std::lock_guard<std::mutex> g(snapshot_mu);
    if (snapshot_key == key) {
      if (snapshot.defined()) {
        at::Tensor hit = snapshot;
        check(pj_checks_report(s->device));  // still a synchronizing point
        // a copy: the caller may write to what it gets, the snapshot must stay as read
        return borrow ? view_of(hit) : view_of(hit).clone(at::MemoryFormat::Preserve);
      }
      again = true;
    }
  }
  at::Tensor whole = at::empty({n}, src.options().device(c10::kCPU));
  if (n > 0) {
    check(pj_transfer_to_host(s->buf, whole.data_ptr(), whole.nbytes()));
    check(pj_checks_report(s->device));  // a synchronizing point, as in to_host
  }
  {
    std::lock_guard<std::mutex> g(snapshot_mu);
    snapshot_key = key;
    snapshot = again ? whole : at::Tensor();
  }
  return again ? view_of(whole).clone(at::MemoryFormat::Preserve) : view_of(whole);
}

// A host tensor with src's values (src on tpu); strided when it is a view of a small storage.
at::Tensor to_host(const at::Tensor& src) {
  // complex32: its float16 pairs travel, and are the complex32 values on the host
  if (src.scalar_type() == at::kComplexHalf)
    return at::view_as_complex(to_host(complex_parts_view(src)));
  at::Tensor dev = src;
  if (!is_whole_storage(dev)) {
    at::Tensor host = whole_storage_to_host(src);
    if (host.defined()) return host;
    dev = at::empty(src.sizes(), src.options());
    device_copy(src, dev);
  }
  pj_storage_t* s = storage_of(dev);
  at::Tensor host = at::empty(src.sizes(), src.options().device(c10::kCPU));
  if (host.numel() == 0) return host;
  check(pj_defer_flush());  // a read sees every recorded op (defer_and_fuse)
  check(pj_storage_materialize(s, to_pj_dtype(dev.scalar_type())));
  check(pj_transfer_to_host(s->buf, host.data_ptr(), host.nbytes()));
  // A read to the host is a synchronizing point: a failed device-side index check of the
  // ops before it raises here (index_checks.h).
  check(pj_checks_report(s->device));
  return host;
}

}  // namespace

c10::Scalar local_scalar(const at::Tensor& self) {
  // An element of a storage read before is taken from its snapshot with no copy of its own
  // (iterating over a tensor reads every element this way); else the general read.
  if (self.scalar_type() != at::kComplexHalf && !self.is_conj() && !self.is_neg() &&
      !is_whole_storage(self)) {
    at::Tensor host = whole_storage_to_host(self, /*borrow=*/true);
    if (host.defined()) return host.item();
  }
  return self.to(c10::kCPU).item();
}

namespace {

// Uploads host data (any layout, any dtype) into dst (tpu, any view).
void from_host(const at::Tensor& src, const at::Tensor& dst) {
  at::Tensor h = src.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
  if (dst.scalar_type() == at::kComplexHalf)  // converted on the host; its float16 pairs travel
    return from_host(at::view_as_real(h.resolve_conj().resolve_neg()), complex_parts_view(dst));
  int device = dst.device().index() < 0 ? 0 : dst.device().index();
  if (is_whole_storage(dst)) {
    pj_storage_t* s = storage_of(dst);
    int64_t n = dst.numel();
    PJRT_Buffer* buf = nullptr;
    check(pj_defer_flush());  // recorded writes to this storage come before the upload
    check(pj_transfer_to_device(device, h.data_ptr(), to_pj_dtype(h.scalar_type()), &n, 1, &buf));
    pj_storage_swap(s, buf, to_pj_dtype(h.scalar_type()));
    return;
  }
  at::Tensor staging = at::empty(dst.sizes(), dst.options().memory_format(c10::MemoryFormat::Contiguous));
  from_host(h, staging);
  device_copy(staging, dst);
}

// src and dst on two different tpu devices (any views, any dtypes). src's values travel as one
// whole buffer in src's element type, device to device (asynchronous: nothing here waits for
// the device); a destination that is not exactly its whole storage in that type gets them
// through a staging tensor on its own device and a device copy there, which also converts the
// dtype and writes into views.
void cross_device_copy(const at::Tensor& src, const at::Tensor& dst) {
  // complex32 travels as its float16 pairs: converted first on the source's device
  if (dst.scalar_type() == at::kComplexHalf || src.scalar_type() == at::kComplexHalf) {
    at::Tensor from = src;
    if (src.scalar_type() != dst.scalar_type()) {
      from = at::empty(src.sizes(), src.options().dtype(dst.scalar_type()));
      from.copy_(src);
    }
    if (dst.scalar_type() != at::kComplexHalf) return cross_device_copy(from, dst);
    return cross_device_copy(complex_parts_view(from), complex_parts_view(dst));
  }
  at::Tensor dev = src;
  if (!is_whole_storage(dev)) {
    dev = at::empty(src.sizes(), src.options().memory_format(c10::MemoryFormat::Contiguous));
    device_copy(src, dev);
  }
  const pj_dtype_t dt = to_pj_dtype(dev.scalar_type());
  pj_storage_t* s = storage_of(dev);
  // The source's recorded ops (defer_and_fuse) must have run, and recorded writes to the
  // destination's storage must come before the buffer replacing its contents.
  check(pj_defer_flush());
  check(pj_storage_materialize(s, dt));
  check(pj_bucket_trim(s));  // the destination takes an exact buffer
  PJRT_Buffer* moved = nullptr;
  check(pj_transfer_between_devices(s->buf, dt, dev.numel(), dst.device().index(), &moved));
  at::Tensor target = dst;
  if (!(is_whole_storage(dst) && dst.scalar_type() == dev.scalar_type()))
    target = at::empty(dev.sizes(), dev.options().device(dst.device()));
  pj_storage_swap(storage_of(target), moved, dt);
  if (!target.is_same(dst)) device_copy(target, dst);
}

}  // namespace

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  // CPU's copy_ (TensorIterator) requires the source to broadcast to the destination, also
  // when nothing is copied: the same errors (infer_size's for shapes that do not broadcast)
  const std::vector<int64_t> shape = at::infer_size(dst.sizes(), self.sizes());
  TORCH_CHECK(dst.sizes().equals(shape), "output with shape ", dst.sizes(),
              " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  if (dst.numel() == 0) return dst;
  warn_complex_to_real(self.scalar_type(), dst.scalar_type());
  // The packed float4 dtype converts to nothing on CPU ("copy_kernel" has no such case); a
  // host side raises that itself, two tpu tensors raise it here (the same type and words).
  if (is_tpu(self) && is_tpu(dst) && self.scalar_type() != dst.scalar_type()) {
    for (const at::Tensor* t : {&self, &dst})
      TORCH_CHECK_NOT_IMPLEMENTED(t->scalar_type() != at::kFloat4_e2m1fn_x2,
                                  "\"copy_kernel\" not implemented for '",
                                  t->scalar_type(), "'");
  }
  if (is_tpu(self) && is_tpu(dst)) {
    if (self.device() == dst.device()) {
      at::assert_no_internal_overlap(dst);
      at::assert_no_partial_overlap(dst, self);
      if (self.scalar_type() == at::kComplexHalf || dst.scalar_type() == at::kComplexHalf)
        complex32_device_copy(self, dst);
      else
        device_copy(self, dst);
    } else {
      cross_device_copy(self, dst);
    }
  } else if (is_tpu(dst)) {
    from_host(self, dst);
  } else if (is_tpu(self)) {
    dst.copy_(to_host(self));
  } else {
    TORCH_CHECK(false, "copy between ", self.device(), " and ", dst.device(),
                " reached the tpu backend");
  }
  return dst;
}

void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes) {
  pj_storage_t* old = static_cast<pj_storage_t*>(storage->data_ptr().get_context());
  TORCH_CHECK(old != nullptr, "resize of a storage that is not a tpu storage");
  if (nbytes <= storage->nbytes()) return;
  // Old contents, if any, must be real before they are copied. An empty or never-written
  // storage (out= factories resize fresh tensors) has none: no flush, so a defer_and_fuse run
  // or a graph capture goes on.
  const bool has_contents = old->nbytes > 0 && (old->buf || old->pending);
  if (has_contents) check(pj_defer_flush());
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  c10::DataPtr fresh = allocate_storage(old->device, nbytes);
  pj_storage_t* ns = static_cast<pj_storage_t*>(fresh.get_context());
  if (has_contents && old->buf) {
    // copy the old contents into the front of the new storage, in the old element type
    size_t item = pj_dtype_info(old->dtype)->itemsize;
    TORCH_CHECK(nbytes % item == 0, "resize to ", nbytes, " bytes, not a multiple of ", item);
    CallBuilder b("_pj_copy", "", old->device);
    pj_call_t& c = b.call();
    c.nslots = 2;
    c.slots[0] = pj_slot_t{old, old->dtype, static_cast<int64_t>(old->capacity / item), true};
    c.slots[1] = pj_slot_t{ns, old->dtype, static_cast<int64_t>(nbytes / item), false};
    pj_arg_t& a = c.args[c.nargs++];
    a = pj_arg_t{};
    a.name = "src";
    a.kind = PJ_ARG_TENSOR;
    a.first = c.ntensors++;
    a.count = 1;
    pj_tensor_desc_t& d = c.tensors[a.first];
    d = pj_tensor_desc_t{};
    d.dtype = old->dtype;
    d.rank = 1;
    d.sizes[0] = static_cast<int64_t>(old->nbytes / item);
    d.strides[0] = 1;
    d.slot = 0;
    pj_tensor_desc_t& o = c.outs[c.nout++];
    o = d;
    o.slot = 1;
    check(pj_call_run(&c));
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(nbytes);
}

}  // namespace torch_pjrt
