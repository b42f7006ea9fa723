/* Host <-> device copies. Uploads are asynchronous (PJRT copies the host data during the call
 * with kImmutableOnlyDuringCall semantics, so the caller may reuse its memory at once).
 * Downloads block until the bytes are on the host: this is where Python waits for the device. */
#ifndef TORCH_PJRT_TRANSFER_H
#define TORCH_PJRT_TRANSFER_H
#include <stdint.h>
#include <stddef.h>
#include "torch_pjrt/status.h"
#include "torch_pjrt/dtype.h"
#ifdef __cplusplus
extern "C" {
#endif
struct PJRT_Buffer;

/* Creates a device buffer of shape dims[rank] (row-major) from contiguous host data. */
pj_status_t *pj_transfer_to_device(int device, const void *data, pj_dtype_t dt,
                                   const int64_t *dims, int rank, struct PJRT_Buffer **out);
/* Copies a device buffer's first `nbytes` into host memory: the whole buffer, or the front of a
 * padded one (storage.h); a buffer smaller than nbytes is an error. */
pj_status_t *pj_transfer_to_host(struct PJRT_Buffer *buf, void *dst, size_t nbytes);
/* Copies a whole 1-D buffer of `numel` elements of type dt onto another device of the client
 * (`device` must differ from the buffer's). Asynchronous where the plugin copies between
 * devices itself (PJRT_Buffer_CopyToDevice): the new buffer becomes ready when the copy, which
 * first waits for the source's contents, completes; that completion is tracked on `device`
 * (stream.h), so synchronize(device) and events there cover it. A plugin without the slot gets
 * a blocking copy through host memory. The source buffer stays owned by the caller and may be
 * destroyed at once: PJRT keeps it alive until the copy has read it. */
pj_status_t *pj_transfer_between_devices(struct PJRT_Buffer *src, pj_dtype_t dt, int64_t numel,
                                         int device, struct PJRT_Buffer **out);
/* Waits for and destroys a PJRT event (NULL: nothing to wait for); returns the event's error
 * (`what` names the operation), or NULL. */
struct PJRT_Event;
pj_status_t *pj_event_await(struct PJRT_Event *ev, const char *what);
/* Waits until the buffer's contents are computed; surfaces any device error. */
pj_status_t *pj_buffer_await(struct PJRT_Buffer *buf);
/* Non-blocking: 1 if ready, 0 if still pending. */
int pj_buffer_is_ready(struct PJRT_Buffer *buf);
void pj_buffer_destroy(struct PJRT_Buffer *buf);
size_t pj_buffer_nbytes(struct PJRT_Buffer *buf);

#ifdef __cplusplus
}
#endif
#endif
