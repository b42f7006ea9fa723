/* The process heap's policy when the device is the host CPU (XLA's CPU plugin): device buffers
 * and XLA's per-execution temporaries are malloc'ed host memory. With glibc's defaults a large
 * block is its own mmap, returned to the system when freed, so every execution that makes a
 * large result or temporary touches fresh pages: a page fault per 4 KiB, on every call (55,000
 * faults per fused grouped GEMM of an MoE layer, half its time). Kept in the heap instead
 * (one arena, no per-block mmap, no trimming), freed blocks are reused as PyTorch's caching
 * allocators reuse device memory; the process's resident size stays at its peak. */
#ifndef TORCH_PJRT_HOST_HEAP_H
#define TORCH_PJRT_HOST_HEAP_H

/* Applies the policy unless TORCH_PJRT_HOST_HEAP=system (glibc's defaults kept). Called when
 * torch_pjrt is imported with the CPU plugin chosen: glibc fixes its number of arenas when a
 * second thread first allocates, so the sooner the better. Returns whether it was applied
 * (false also where the C library is not glibc). */
int pj_host_heap_configure(void);

#endif
