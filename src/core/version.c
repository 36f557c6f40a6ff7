/*
 * version.c — what this build is: version and the options it was built with.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "dplua.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "0.0.0"
#endif

const char *dp_version(void)
{
    return PACKAGE_VERSION;
}

const char *dp_build_options(void)
{
    return ""
#ifdef DP_HAVE_CUDA
        "cuda "
#endif
#ifdef DP_HAVE_CUBLASLT
        "cublaslt "
#endif
#ifdef DP_HAVE_NCCL
        "nccl "
#endif
#ifdef DP_HAVE_GLOO
        "gloo "
#endif
#ifdef HAVE_LIBEDIT
        "libedit "
#endif
        "openblas";
}
