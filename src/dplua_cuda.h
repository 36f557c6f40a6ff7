/*
 * dplua_cuda.h — the CUDA entry points of dplua's C API: devices, memory
 * statistics, streams, events and graphs. Tensors reach a GPU through
 * dplua.h's functions (a device ordinal instead of DP_CPU); these are for
 * what torch.cuda does besides. In a build without CUDA the counts are 0
 * and the other calls fail with a message that says so.
 *
 * Declarations between the DP_CDEF markers stay plain C (see dplua.h).
 */
#ifndef DPLUA_CUDA_H
#define DPLUA_CUDA_H

#include "dplua.h"

#ifdef __cplusplus
extern "C" {
#endif

/* DP_CDEF_BEGIN */
/* devices */
DP_API int dp_cuda_device_count(void);
DP_API dp_status dp_cuda_devices(int *count);   /* *count GPUs, or an error that says why there are none */
DP_API dp_status dp_cuda_synchronize(int device);
DP_API void dp_cuda_set_allow_tf32(int allow);

/* torch.cuda's memory and device queries (dplua.h's dp_memory_allocated
 * counts the tensors; these the pools). empty_cache gives the pool's
 * cached memory back to the driver. */
DP_API dp_status dp_cuda_empty_cache(int device);
DP_API dp_status dp_cuda_memory_reserved(int device, int64_t *now, int64_t *peak);
DP_API dp_status dp_cuda_mem_get_info(int device, int64_t *free_bytes, int64_t *total_bytes);
DP_API dp_status dp_cuda_device_properties(int device, char *name, size_t name_len, int64_t *total_memory,
                                           int *major, int *minor, int *multiprocessors);

/* Streams and events (cudaStream_t / cudaEvent_t as void *). Each device
 * has a current stream (NULL: its legacy default stream) where the
 * kernels and copies of its tensors go. Synchronisations also raise the
 * errors that kernels found since the last one (a bad class index...). */
DP_API dp_status dp_cuda_stream_new(void **stream, int device);
DP_API void dp_cuda_stream_free(void *stream);
DP_API dp_status dp_cuda_set_stream(int device, void *stream);
DP_API void *dp_cuda_current_stream(int device);
DP_API dp_status dp_cuda_stream_synchronize(void *stream);
DP_API dp_status dp_cuda_stream_query(void *stream, int *done);
DP_API dp_status dp_cuda_stream_wait_event(void *stream, void *event);
DP_API dp_status dp_cuda_event_new(void **event, int device, int timing);
DP_API void dp_cuda_event_free(void *event);
DP_API dp_status dp_cuda_event_record(void *event, void *stream);
DP_API dp_status dp_cuda_event_synchronize(void *event);
DP_API dp_status dp_cuda_event_query(void *event, int *done);
DP_API dp_status dp_cuda_event_elapsed(double *ms, void *start, void *end);

/* The kernel profile (torch.cuda.profile_kernels): between start and
 * stop every kernel of dplua's and every cuBLASLt product is timed on its
 * stream; stop waits for them and gives the number of rows (kernels by
 * name, total time descending), the launches not recorded (past the
 * cap) and the time from the first start to the last end. */
DP_API dp_status dp_cuda_profile_start(void);
DP_API dp_status dp_cuda_profile_stop(int *rows, int64_t *dropped, double *span_ms);
DP_API dp_status dp_cuda_profile_row(int i, const char **name, int64_t *calls, double *ms);

/* CUDA graphs: begin makes a capture stream current on the device; what
 * runs until end (keep = 0 discards it, after an error) is recorded, not
 * executed, and replay runs it on the current stream. Memory allocated
 * during the capture belongs to the graph (see docs/API.md). */
typedef struct dp_cuda_graph dp_cuda_graph;
DP_API int dp_cuda_capturing(void);   /* 1 while a capture is under way */
DP_API dp_status dp_cuda_graph_begin(dp_cuda_graph **out, int device);
DP_API dp_status dp_cuda_graph_end(dp_cuda_graph *g, int keep);
DP_API dp_status dp_cuda_graph_replay(dp_cuda_graph *g);
DP_API void dp_cuda_graph_free(dp_cuda_graph *g);
/* DP_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif /* DPLUA_CUDA_H */
