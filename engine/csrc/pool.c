/* The thread pool every multi-threaded kernel shares its work through (parallel_chunks). */
#define _GNU_SOURCE
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>

#include "zg_simd.h"

/* A work-sharing pool that never waits for a thread the OS has not scheduled. The caller posts
   a job of `nchunks` chunks, then claims chunks itself; workers that wake in time claim the
   rest. The caller waits only for chunks a worker has CLAIMED, so a worker that is descheduled
   (a 2-core box with a client and an I/O loop beside the engine) costs nothing: the caller does
   its share. OpenMP's team barrier instead waits for every thread of the team, one scheduler
   slice per parallel region when a core is busy (measured: steps 5-20x slower under load).
   state = generation (16 bits) | threads (8) | nchunks (20) | next chunk (20): a claim is one
   CAS that also proves the job is still the one the claimer saw.

   A worker must not share its caller's core: there it computes nothing in parallel (it runs only
   when the caller is preempted) and its spin between jobs takes the caller's time. Two ways it
   got there, both measured (tests/engine/test_kernel_pool_starts.py):
   - inherited affinity: pthread_create copies the creating thread's CPU mask, and the pool grows
     from whichever thread posts the first job; a caller pinned to one CPU pinned every worker
     to that same CPU for the life of the process. Workers now take the process's CPU set (the
     main thread's mask) when they start;
   - placement: a futex wake-up while the box's other cores are busy (a load generator, the I/O
     loop) puts the worker on its waker's CPU (wake-affine, no idle CPU to choose), and a worker
     that then spins from job to job is never placed again, while the load balancer counts two
     runnable threads per core and sees nothing to move. A served SmolLM2 fp32 start on a busy
     2-core box had its worker on the caller's CPU in 64% of its jobs (0.56 cores busy) where the
     other starts had 13-22% (1.2 cores). A worker that finds itself on its caller's CPU when a
     job starts now moves off it (its mask without that CPU, then the whole set again: the move
     is made, the mask is not kept), before it claims a chunk. */
#define POOL_MAX 63
/* ~240 us at 2.5 GHz spinning for the next job, then a futex sleep: long enough to bridge the
   Python between a step's two calls and between steps, so a worker is awake for the next job
   (dummy:small served at c=1, ITL p50 over 3 alternating pairs: 80 us 7.41/7.56/7.64 ms, this
   7.03/7.43/7.62; 600 us cost TTFT: 13.9-16.3 vs 11.1-11.9 ms, the spinner beside the request's
   own Python on 2 cores) */
#define SPIN_CYCLES 600000ULL

static struct {
    _Atomic uint64_t state;
    _Atomic int32_t stop;         /* pool_stop: workers exit at the next generation they see */
    _Atomic int32_t gen_word;     /* futex word: the generation of the job posted last */
    _Atomic int64_t done;
    _Atomic int32_t sleepers;
    chunk_fn fn;
    void *args;
    uint32_t gen;
    int nworkers;
    pthread_t threads[POOL_MAX];
    cpu_set_t cpus;               /* the process's CPUs (the main thread's mask) when the pool grew */
    int ncpus;
    pthread_mutex_t busy;         /* one job at a time; a second caller runs serially */
    pthread_mutex_t grow;
    /* per thread id, each written only by its thread (the caller's under `busy`): read by tests */
    /* shared: jobs in which the thread ran on the CPU its caller posted the job from (stacked
       on one core with it: a worker placed there on wake-up computes nothing in parallel) */
    /* moved: jobs at whose start the thread found itself on its caller's CPU and moved off it */
    struct { int64_t chunks, jobs, shared, moved; char pad[32]; } count[POOL_MAX + 1];
    _Atomic int32_t caller_cpu;   /* sched_getcpu() of the caller when it posted the job */
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER, .grow = PTHREAD_MUTEX_INITIALIZER};

static inline void count_job(int tid, int64_t chunks) {
    __atomic_fetch_add(&pool.count[tid].chunks, chunks, __ATOMIC_RELAXED);
    __atomic_fetch_add(&pool.count[tid].jobs, 1, __ATOMIC_RELAXED);
    if (tid && sched_getcpu() == atomic_load_explicit(&pool.caller_cpu, memory_order_relaxed))
        __atomic_fetch_add(&pool.count[tid].shared, 1, __ATOMIC_RELAXED);
}

static inline uint64_t pack(uint64_t gen, uint64_t nt, uint64_t n, uint64_t next) {
    return (gen & 0xffff) << 48 | (nt & 0xff) << 40 | (n & 0xfffff) << 20 | (next & 0xfffff);
}

/* claim the next chunk of the job whose state had generation gen; -1 when none is left */
static inline int64_t claim(uint32_t gen, int tid) {
    uint64_t v = atomic_load_explicit(&pool.state, memory_order_acquire);
    for (;;) {
        if ((v >> 48) != (gen & 0xffff) || (int64_t)((v >> 40) & 0xff) <= tid) return -1;
        uint64_t n = (v >> 20) & 0xfffff, next = v & 0xfffff;
        if (next >= n) return -1;
        if (atomic_compare_exchange_weak_explicit(&pool.state, &v, v + 1, memory_order_acq_rel,
                                                  memory_order_acquire))
            return (int64_t)next;
    }
}

/* off the caller's CPU: a mask without it moves the thread now; the whole set again lets the
   scheduler place it freely from there on */
static void move_off(int tid, int cpu) {
    if (pool.ncpus < 2 || cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &pool.cpus)) return;
    cpu_set_t others = pool.cpus;
    CPU_CLR(cpu, &others);
    if (sched_setaffinity(0, sizeof others, &others) == 0) {
        sched_setaffinity(0, sizeof pool.cpus, &pool.cpus);
        __atomic_fetch_add(&pool.count[tid].moved, 1, __ATOMIC_RELAXED);
    }
}

static void *pool_worker(void *arg) {
    int tid = (int)(intptr_t)arg;
    if (pool.ncpus > 0) sched_setaffinity(0, sizeof pool.cpus, &pool.cpus);  /* not the creator's mask */
    int32_t seen = atomic_load_explicit(&pool.gen_word, memory_order_acquire);
    for (;;) {
        int32_t g;
        uint64_t t0 = __rdtsc();
        while ((g = atomic_load_explicit(&pool.gen_word, memory_order_acquire)) == seen) {
            if (__rdtsc() - t0 < SPIN_CYCLES) { _mm_pause(); continue; }
            atomic_fetch_add(&pool.sleepers, 1);
            if (atomic_load(&pool.gen_word) == seen)
                syscall(SYS_futex, &pool.gen_word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
            atomic_fetch_sub(&pool.sleepers, 1);
            t0 = __rdtsc();
        }
        seen = g;
        if (atomic_load(&pool.stop)) break;
        int cpu = sched_getcpu();
        if (cpu == atomic_load_explicit(&pool.caller_cpu, memory_order_relaxed)) move_off(tid, cpu);
        int64_t c, mine = 0;
        while ((c = claim((uint32_t)g, tid)) >= 0) {
            pool.fn(pool.args, c, tid);  /* fn/args stay valid: the job cannot end before this chunk is done */
            mine++;
            atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
        }
        if (mine) count_job(tid, mine);
    }
    return NULL;
}

static int pool_grow(int want) {
    pthread_mutex_lock(&pool.grow);
    if (pool.nworkers < want && pool.ncpus == 0) {
        CPU_ZERO(&pool.cpus);
        pool.ncpus = sched_getaffinity(getpid(), sizeof pool.cpus, &pool.cpus) == 0 ? CPU_COUNT(&pool.cpus) : 0;
    }
    while (pool.nworkers < want && pool.nworkers < POOL_MAX) {
        if (pthread_create(&pool.threads[pool.nworkers], NULL, pool_worker, (void *)(intptr_t)(pool.nworkers + 1)))
            break;
        pool.nworkers++;
    }
    int have = pool.nworkers;
    pthread_mutex_unlock(&pool.grow);
    return have;
}

/* fn(args, chunk, tid) for chunk in [0, nchunks), tid in [0, nt): tid 0 is the caller */
void parallel_chunks(chunk_fn fn, void *args, int64_t nchunks, int64_t nt) {
    if (nt > POOL_MAX + 1) nt = POOL_MAX + 1;
    if (nt > 1 && nchunks > 1 && nchunks < 0xfffff - POOL_MAX && pthread_mutex_trylock(&pool.busy) == 0) {
        int have = pool_grow((int)nt - 1);
        if (have + 1 < nt) nt = have + 1;
        if (nt > 1) {
            pool.fn = fn;
            pool.args = args;
            atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
            atomic_store_explicit(&pool.caller_cpu, sched_getcpu(), memory_order_relaxed);
            uint32_t gen = ++pool.gen;
            atomic_store_explicit(&pool.state, pack(gen, (uint64_t)nt, (uint64_t)nchunks, 0), memory_order_release);
            /* seq_cst (an xchg), not release: with a release store the load of `sleepers` below may
               complete before the store is visible (x86 store->load reordering), while a worker
               increments `sleepers` and reads the old gen_word: Dekker's pattern needs both sides
               sequentially consistent, else that worker's wake-up is lost for this job */
            atomic_store(&pool.gen_word, (int32_t)gen);
            if (atomic_load(&pool.sleepers) > 0)
                syscall(SYS_futex, &pool.gen_word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
            int64_t c, mine = 0;
            while ((c = claim(gen, 0)) >= 0) { fn(args, c, 0); mine++; }
            if (mine) count_job(0, mine);
            atomic_fetch_add_explicit(&pool.done, mine, memory_order_acq_rel);
            while (atomic_load_explicit(&pool.done, memory_order_acquire) < nchunks) _mm_pause();
            pthread_mutex_unlock(&pool.busy);
            return;
        }
        pthread_mutex_unlock(&pool.busy);
    }
    for (int64_t c = 0; c < nchunks; c++) fn(args, c, 0);
    if (nchunks > 0) count_job(0, nchunks);
}

void pool_stop(void) {
    pthread_mutex_lock(&pool.busy);
    pthread_mutex_lock(&pool.grow);
    if (pool.nworkers > 0) {
        atomic_store(&pool.stop, 1);
        /* a generation no job has: every worker leaves its spin or its futex wait, sees stop */
        uint32_t gen = ++pool.gen;
        atomic_store_explicit(&pool.state, pack(gen, 0, 0, 0), memory_order_release);
        atomic_store(&pool.gen_word, (int32_t)gen);
        syscall(SYS_futex, &pool.gen_word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
        for (int i = 0; i < pool.nworkers; i++) pthread_join(pool.threads[i], NULL);
        pool.nworkers = 0;
        atomic_store(&pool.stop, 0);
    }
    pool.ncpus = 0;  /* the next pool takes the process's CPU set as it is then */
    pthread_mutex_unlock(&pool.grow);
    pthread_mutex_unlock(&pool.busy);
}

int64_t pool_workers(void) {
    pthread_mutex_lock(&pool.grow);
    int64_t n = pool.nworkers;
    pthread_mutex_unlock(&pool.grow);
    return n;
}

/* chunks[tid] / jobs[tid] / shared[tid] for tid in [0, n) (0 is the caller); call between jobs */
void pool_counters(int64_t *chunks, int64_t *jobs, int64_t *shared, int64_t *moved, int64_t n) {
    pthread_mutex_lock(&pool.busy);
    for (int64_t t = 0; t < n; t++) {
        int ok = t <= POOL_MAX;
        chunks[t] = ok ? __atomic_load_n(&pool.count[t].chunks, __ATOMIC_RELAXED) : 0;
        jobs[t] = ok ? __atomic_load_n(&pool.count[t].jobs, __ATOMIC_RELAXED) : 0;
        shared[t] = ok ? __atomic_load_n(&pool.count[t].shared, __ATOMIC_RELAXED) : 0;
        moved[t] = ok ? __atomic_load_n(&pool.count[t].moved, __ATOMIC_RELAXED) : 0;
    }
    pthread_mutex_unlock(&pool.busy);
}

void pool_reset_counters(void) {
    pthread_mutex_lock(&pool.busy);
    for (int t = 0; t <= POOL_MAX; t++) {
        __atomic_store_n(&pool.count[t].chunks, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&pool.count[t].jobs, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&pool.count[t].shared, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&pool.count[t].moved, 0, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&pool.busy);
}
