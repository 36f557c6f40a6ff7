/*
 * profile.cu — where the GPU's time goes, kernel by kernel: while a
 * profile is on, every launch of ours (launch.cuh's one launch point)
 * and every cuBLASLt product (gemm_lt.cu) is bracketed by two timing
 * events on its stream; dpc_profile_stop waits for them and sums the
 * elapsed times by kernel. This is what ncu would tell, from inside the
 * program, on hosts where ncu cannot run (gVisor).
 *
 * The events serialise the stream around each kernel (PDL's overlap of
 * one kernel's start with the end of the one before is lost), so a
 * profiled step takes a little longer than an unprofiled one; a kernel's
 * own time is what it measures. Launches into a stream being captured
 * into a CUDA graph are not recorded (events cannot be timed there).
 */
#include <cxxabi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "dpc_ops.h"

namespace {
struct record {
    const void *func;    /* the kernel, or NULL for a labelled product */
    std::string label;
    cudaEvent_t start, end;
};
struct profile_state {
    pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
    std::vector<record> records;
    std::vector<cudaEvent_t> spare;      /* events of earlier profiles, reused */
    std::vector<dpc_profile_row> rows;   /* the last stop's */
    std::vector<std::string> names;      /* rows' names live here */
    int64_t dropped = 0;
    double span_ms = 0;
};
profile_state prof;
}  // namespace

int dpc_profiling = 0;

/* At most this many launches a profile: a few training steps of a large
 * model, a few megabytes of events. */
#define PROFILE_MAX_RECORDS 400000

int dpc_profile_start(void)
{
    pthread_mutex_lock(&prof.mutex);
    for (record &r : prof.records) {
        prof.spare.push_back(r.start);
        prof.spare.push_back(r.end);
    }
    prof.records.clear();
    prof.dropped = 0;
    dpc_profiling = 1;
    pthread_mutex_unlock(&prof.mutex);
    return 0;
}

static cudaEvent_t take_event(void)
{
    cudaEvent_t e = NULL;
    if (!prof.spare.empty()) {
        e = prof.spare.back();
        prof.spare.pop_back();
    } else if (cudaEventCreate(&e) != cudaSuccess) {
        (void)cudaGetLastError();
        e = NULL;
    }
    return e;
}

int64_t dpc_profile_before(void *stream, const void *func, const char *label)
{
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &capturing) != cudaSuccess || capturing) {
        (void)cudaGetLastError();
        return 0;
    }
    int64_t token = 0;
    pthread_mutex_lock(&prof.mutex);
    if (dpc_profiling) {
        cudaEvent_t start = prof.records.size() < PROFILE_MAX_RECORDS ? take_event() : NULL;
        cudaEvent_t end = start ? take_event() : NULL;
        if (end && cudaEventRecord(start, (cudaStream_t)stream) == cudaSuccess) {
            prof.records.push_back(record{ func, label ? label : "", start, end });
            token = (int64_t)prof.records.size();
        } else {
            (void)cudaGetLastError();
            if (start)
                prof.spare.push_back(start);
            if (end)
                prof.spare.push_back(end);
            prof.dropped++;
        }
    }
    pthread_mutex_unlock(&prof.mutex);
    return token;
}

/* The end event of the record that dpc_profile_before opened. */
void dpc_profile_after(void *stream, int64_t token)
{
    if (token <= 0)
        return;
    pthread_mutex_lock(&prof.mutex);
    if (token <= (int64_t)prof.records.size() &&
        cudaEventRecord(prof.records[(size_t)token - 1].end, (cudaStream_t)stream) != cudaSuccess)
        (void)cudaGetLastError();
    pthread_mutex_unlock(&prof.mutex);
}

/* A kernel's name as its source spells it: demangled, without its
 * parameter list and anonymous namespace. */
static std::string kernel_name(const void *func)
{
    const char *mangled = NULL;
    if (cudaFuncGetName(&mangled, func) != cudaSuccess || mangled == NULL) {
        (void)cudaGetLastError();
        return "(unnamed kernel)";
    }
    int status = 0;
    char *plain = abi::__cxa_demangle(mangled, NULL, NULL, &status);
    std::string name = status == 0 && plain ? plain : mangled;
    free(plain);
    for (const char *drop : { "(anonymous namespace)::", "void " }) {
        for (size_t at; (at = name.find(drop)) != std::string::npos;)
            name.erase(at, strlen(drop));
    }
    /* cut the parameter list: the last '(' at template depth 0 */
    int depth = 0;
    for (size_t i = 0; i < name.size(); i++) {
        if (name[i] == '<')
            depth++;
        else if (name[i] == '>')
            depth--;
        else if (name[i] == '(' && depth == 0) {
            name.resize(i);
            break;
        }
    }
    return name;
}

int dpc_profile_stop(void)
{
    pthread_mutex_lock(&prof.mutex);
    dpc_profiling = 0;
    std::map<std::string, dpc_profile_row> by_name;
    std::map<const void *, std::string> names_of;
    int rc = 0;
    prof.span_ms = 0;
    for (const record &r : prof.records) {
        float ms = 0;
        int e = (int)cudaEventSynchronize(r.end);
        if (e == 0)
            e = (int)cudaEventElapsedTime(&ms, r.start, r.end);
        if (e != 0) {
            (void)cudaGetLastError();
            rc = rc ? rc : e;
            continue;
        }
        std::string name = r.label;
        if (r.func) {
            auto it = names_of.find(r.func);
            if (it == names_of.end())
                it = names_of.emplace(r.func, kernel_name(r.func)).first;
            name = it->second;
        }
        dpc_profile_row &row = by_name[name];
        row.calls++;
        row.ms += ms;
    }
    if (!prof.records.empty()) {
        float span = 0;
        if (cudaEventElapsedTime(&span, prof.records.front().start, prof.records.back().end) == cudaSuccess)
            prof.span_ms = span;   /* meaningful when they ran on one device */
        (void)cudaGetLastError();
    }
    prof.names.clear();
    prof.rows.clear();
    prof.names.reserve(by_name.size());
    for (auto &kv : by_name) {
        prof.names.push_back(kv.first);
        prof.rows.push_back(kv.second);
    }
    for (size_t i = 0; i < prof.rows.size(); i++)
        prof.rows[i].name = prof.names[i].c_str();
    std::sort(prof.rows.begin(), prof.rows.end(),
              [](const dpc_profile_row &a, const dpc_profile_row &b) { return a.ms > b.ms; });
    pthread_mutex_unlock(&prof.mutex);
    return rc;
}

int dpc_profile_rows(const dpc_profile_row **rows, int *n, int64_t *dropped, double *span_ms)
{
    pthread_mutex_lock(&prof.mutex);
    *rows = prof.rows.data();
    *n = (int)prof.rows.size();
    *dropped = prof.dropped;
    *span_ms = prof.span_ms;
    pthread_mutex_unlock(&prof.mutex);
    return 0;
}
