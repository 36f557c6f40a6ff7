/*
 * pg_group.h — a process group's state, shared by pg.c (ordering, running
 * ops, the dp_pg_* API) and pg_store.c (what a group keeps in the store:
 * progress, errors, fingerprints, and the diagnosis of a failed op).
 * Plain C11 (atomics): the backends see only pg.h.
 */
#ifndef DP_DIST_PG_GROUP_H
#define DP_DIST_PG_GROUP_H

#include "dist/pg.h"

#include <pthread.h>
#include <stdatomic.h>

#define PG_MSG 1024
#define PG_NAME 96

typedef dp_status (*pg_run_fn)(void *impl, const pg_op *op, char *err, size_t errlen);
typedef void (*pg_free_fn)(void *impl);
typedef dp_status (*pg_finish_fn)(void *impl, void *pending, char *err, size_t errlen);
typedef void (*pg_abort_fn)(void *impl);

/* What this rank last read of another rank's heartbeat (pg_store.c), and
 * when it first read it on its own clock: a beat that does not change
 * while the rank's connection stays open means a frozen rank, a state
 * ("seq in fingerprint" or "seq done") that does not change, a stuck one. */
typedef struct {
    uint64_t beat;
    double beat_at;          /* 0: never read */
    char state[192];
    double state_at;
} pg_peer;

struct dp_work {
    dp_pg *pg;
    pg_op op;
    dp_tensor *hold[2];      /* retained by the caller (async ops only) */
    atomic_int done;
    int orphaned;            /* dp_work_free came first: the worker parks it */
    int heap;                /* malloc'd (async) or on the caller's stack (sync) */
    dp_status status;
    char msg[PG_MSG];
    dp_work *next;
    pg_p2p *parts;           /* PG_P2P: its sends and receives (malloc'd), */
    dp_tensor **part_holds;  /* their tensors, retained, */
    void *pending;           /* and the backend's handle once posted */
};

struct dp_pg {
    int holders;                     /* references besides the creator's (pg_retain: a DDP's); freed at the last */
    uint64_t id;                     /* pg_find's; 0 once torn down */
    dp_pg *next_live;                /* the list pg_find searches */
    int torn_down;                   /* pg_teardown ran: ops fail as broken */
    char name[PG_NAME];
    char prefix[PG_NAME + 16];       /* "dplua/<name>/" */
    const char *backend;
    int rank, size;
    int *ranks;                      /* global rank of each member */
    dp_store *store;
    double timeout_s;
    double stall_s;                  /* DPLUA_DIST_STALL: compare the ranks' calls after this; 0: never */
    int debug;
    uint64_t seq;                    /* collectives issued (caller's thread) */

    void *impl;
    pg_run_fn run;
    pg_free_fn free_impl;
    pg_finish_fn finish;

    /* PG_P2P ops the worker posted, finished in order by their own thread
     * (under mu, started on first use) */
    dp_work *posted_head, *posted_tail;
    int finisher_started;
    pthread_t finisher;
    pg_abort_fn abort;               /* ends the running op at once (from another thread); NULL: cannot */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    dp_work *head, *tail;            /* the FIFO */
    int busy;                        /* an op is running (worker or caller) */
    int stop, started;
    pthread_t thread;
    atomic_uint_fast64_t entered;    /* the last collective this rank entered */
    atomic_uint_fast64_t finished;   /* the last one it finished (entered > finished: in one) */
    pg_op current;                   /* the op of `entered` (under mu) */
    pg_peer *peers;                  /* per group rank, under mu (the heartbeat's reads) */
    double store_silent_at;          /* under mu: the store has not answered since then; 0: it answers */
    int hb_started;
    pthread_t hb_thread;
    pthread_cond_t hb_cv;
    dp_work *parked;                 /* finished orphans, freed by the caller */

    dp_status broken;                /* set once, under mu, by the running op */
    char broken_msg[PG_MSG];
};

/* pg.c: the names of the pg_kind values, for messages. */
extern const char *const pg_kind_names[];

/* pg.c: every live group has an id that outlives it: an autograd node
 * keeps the id of its group, not a pointer, and pg_find gives the group
 * (retained: pg_release it) or NULL once it was destroyed. */
uint64_t pg_id(const dp_pg *pg);
dp_pg *pg_find(uint64_t id);
/* pg.c: breaks the group with msg (the first failure's message stays) and
 * leaves msg in the store for the other ranks. Any thread. */
void pg_break(dp_pg *pg, dp_status st, const char *msg);

/* ---------------------------------------------------------------- pg_store.c */

/* "rank 3" in the default group, "rank 3 (group rank 1)" in a subgroup. */
const char *pg_rank_str(const dp_pg *pg, int r, char *buf, size_t len);

/* The heartbeat: a thread that publishes this rank's state (the last
 * collective it entered, whether it is still in it and that op's
 * fingerprint, and a beat count) to the store, for the other ranks'
 * diagnosis; and, while this rank's collective is stalled, reads the other
 * ranks' states and breaks the group when they show mismatched calls
 * (pg_store.c's header comment). Started with the group's first
 * collective, on the caller's thread; stopped by the group's teardown
 * after pg->stop is set. Both are safe to call when it does not run. */
void pg_heartbeat_start(dp_pg *pg);
void pg_heartbeat_stop(dp_pg *pg);

/* Leaves msg, this rank's failure, in the store for the other ranks'
 * diagnosis (this rank may be gone by the time they look). */
void pg_publish_error(dp_pg *pg, const char *msg);

/* Appends to msg (of capacity PG_MSG) what the store says about the other
 * ranks when `op` failed: the ranks that are dead, or did not arrive, or
 * reported an error of their own. peer_lost: the backend lost a
 * connection (rather than timing out). */
void pg_diagnose(dp_pg *pg, const pg_op *op, int peer_lost, char *msg);

/* After `op` failed: whether the states the ranks published show that
 * they called different collectives; if so the message (the one debug
 * mode gives) is in msg, of capacity PG_MSG. The heartbeat's own finding,
 * when it broke the group first, is taken as it is. */
int pg_mismatch_after_failure(dp_pg *pg, const pg_op *op, char *msg);

/* Debug mode (DPLUA_DIST_DEBUG=1): publishes this rank's fingerprint of op
 * and compares every rank's; a difference or a rank that does not arrive
 * fails with a message in msg (of capacity PG_MSG). */
dp_status pg_check_fingerprints(dp_pg *pg, const pg_op *op, char *msg);

#endif /* DP_DIST_PG_GROUP_H */
