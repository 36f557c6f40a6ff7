/*
 * error.c — the last error message, per thread.
 *
 * Functions below the binding layer never print or exit: they record a
 * message here and return a status; the Lua wrapper raises it.
 */
#include "core/tensor.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[1024];

const char *dp_last_error(void)
{
    return last_error;
}

dp_status dp_fail(dp_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

const char *dp_device_str(char *buf, size_t len, int device)
{
    if (device == DP_CPU)
        snprintf(buf, len, "cpu");
    else
        snprintf(buf, len, "cuda:%d", device);
    return buf;
}

const char *dp_shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, len - n, "[");
    for (int i = 0; i < ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
    return buf;
}
