/* engine._lanes (c/lanes.c): the threads that share a product's rows, started once and parked
 * between products (starting a thread per call costs ~100 us, more than a small product takes).
 *
 * lanes_pool_run hands out chunks of rows from one counter, as ggml's mul_mat hands out its
 * chunks (threadpool->current_chunk): the calling thread and the woken workers each take the
 * next chunk until none is left, so a thread that runs faster takes more. Each output is one
 * row's own sum, so which thread computes a row changes no bit.
 *
 * Between products a worker polls for the next one for a while (SPIN_NS) before it sleeps, as
 * ggml's threads poll between a graph's nodes: a token's products come tens of microseconds
 * apart, and waking a sleeping thread costs about as long as a small product takes. The caller
 * likewise polls for the workers to leave a job before it sleeps.
 *
 * One product at a time: a call that finds the pool busy (another Python thread's product)
 * runs its rows on its own thread. Workers are started when first needed, as many as the
 * largest count asked (up to LANES_POOL_MAX), and kept; one that cannot start leaves its share
 * to the threads that did. After fork the child has none of the parent's workers: its pool
 * starts empty (pthread_atfork) and grows again when asked. */
#include "lanes.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>

#define SPIN_NS 300000  /* how long a worker (or the caller) polls before it sleeps */

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* poll while *p equals `value`: true once it differs, false after SPIN_NS (then the caller
 * sleeps on its condition variable) */
static int spin_while_equal(const unsigned long *p, unsigned long value)
{
    const long long until = now_ns() + SPIN_NS;
    for (int i = 1; __atomic_load_n(p, __ATOMIC_ACQUIRE) == value; i++) {
        relax();
        if (i % 64 == 0 && now_ns() > until)
            return 0;
    }
    return 1;
}

typedef struct {
    lanes_rows_fn fn;
    void *ctx;
    Py_ssize_t n, chunk;  /* rows [0, n), handed out `chunk` at a time */
    Py_ssize_t next;      /* the first row not yet handed out (atomic) */
    int want;             /* workers 1 .. want take part (the caller is 0) */
} Job;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    pthread_mutex_t submit;  /* held by the one call whose job the pool runs */
    int started;             /* workers running, numbered 1 .. started */
    unsigned long gen;       /* bumped for each job: a worker wakes when it changes */
    Job *job;                /* the job being run; NULL once its caller has run out of rows */
    unsigned long inside;    /* workers in job's rows now */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_MUTEX_INITIALIZER, 0, 0, NULL, 0};

static void take_rows(Job *j, int worker)
{
    for (;;) {
        const Py_ssize_t a = __atomic_fetch_add(&j->next, j->chunk, __ATOMIC_RELAXED);
        if (a >= j->n)
            return;
        j->fn(j->ctx, worker, a, a + j->chunk < j->n ? a + j->chunk : j->n);
    }
}

typedef struct {
    int worker;
    unsigned long seen;  /* the generation already seen when the worker was started */
} Start;

static void *work(void *arg)
{
    Start s = *(Start *)arg;
    PyMem_RawFree(arg);
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        if (pool.gen == s.seen) {  /* poll a while without the lock, then sleep */
            pthread_mutex_unlock(&pool.mu);
            spin_while_equal(&pool.gen, s.seen);
            pthread_mutex_lock(&pool.mu);
            while (pool.gen == s.seen)
                pthread_cond_wait(&pool.wake, &pool.mu);
        }
        s.seen = pool.gen;
        Job *j = pool.job;
        if (!j || s.worker > j->want)  /* woken too late, or not needed */
            continue;
        __atomic_add_fetch(&pool.inside, 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&pool.mu);
        take_rows(j, s.worker);
        pthread_mutex_lock(&pool.mu);
        if (__atomic_sub_fetch(&pool.inside, 1, __ATOMIC_RELEASE) == 0 && pool.job == NULL)
            pthread_cond_signal(&pool.done);
    }
    return NULL;
}

/* the child of a fork has only the thread that forked: an empty pool, nothing locked */
static void after_fork_in_child(void)
{
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pthread_mutex_init(&pool.submit, NULL);
    pool.started = 0;
    pool.gen = 0;
    pool.job = NULL;
    pool.inside = 0;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void register_fork_handler(void) { pthread_atfork(NULL, NULL, after_fork_in_child); }

/* start workers up to `want` (pool.mu held); a worker that cannot start is left out */
static void grow(int want)
{
    if (pool.started >= want)
        return;
    pthread_attr_t attr;
    sigset_t all, old;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, (size_t)1 << 20);  /* the loops keep little on the stack */
    sigfillset(&all);  /* signals stay with Python's threads */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    while (pool.started < want) {
        Start *s = PyMem_RawMalloc(sizeof *s);
        pthread_t tid;
        if (!s)
            break;
        *s = (Start){pool.started + 1, pool.gen};
        if (pthread_create(&tid, &attr, work, s) != 0) {
            PyMem_RawFree(s);
            break;
        }
#ifdef __linux__
        pthread_setname_np(tid, "lanes-pool");  /* as `top -H` and /proc show it */
#endif
        pool.started++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
}

LANES_HIDDEN void lanes_pool_run(lanes_rows_fn fn, void *ctx, Py_ssize_t n, Py_ssize_t chunk,
                                 int threads)
{
    Job job = {fn, ctx, n, chunk < 1 ? 1 : chunk, 0, 0};
    if (threads > LANES_POOL_MAX)
        threads = LANES_POOL_MAX;
    if (threads < 2 || n <= job.chunk || pthread_mutex_trylock(&pool.submit) != 0) {
        fn(ctx, 0, 0, n);  /* alone: one thread asked, one chunk, or the pool is busy */
        return;
    }
    pthread_once(&once, register_fork_handler);
    pthread_mutex_lock(&pool.mu);
    grow(threads - 1);
    job.want = pool.started < threads - 1 ? pool.started : threads - 1;
    pool.job = &job;
    __atomic_add_fetch(&pool.gen, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);

    take_rows(&job, 0);

    pthread_mutex_lock(&pool.mu);
    pool.job = NULL;  /* no worker enters job now; wait for those inside (polling first) */
    if (pool.inside > 0) {
        pthread_mutex_unlock(&pool.mu);
        /* (inside only falls now that no worker can enter: a window per worker at most) */
        for (unsigned long n; (n = __atomic_load_n(&pool.inside, __ATOMIC_ACQUIRE)) > 0 &&
                              spin_while_equal(&pool.inside, n);)
            ;
        pthread_mutex_lock(&pool.mu);
    }
    while (pool.inside > 0)
        pthread_cond_wait(&pool.done, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.submit);
}
