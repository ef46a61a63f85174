#include "edge/common/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>

namespace edge {
namespace {

// With grain 0, a few chunks per thread, so a thread that wakes late or gets a slow chunk is
// covered by the others instead of holding up the whole loop.
constexpr std::size_t auto_chunks_per_thread = 4;

// How long an idle worker, and a caller waiting for its helpers, spin before sleeping on a
// condition variable. The CPU executor issues a parallel loop every few hundred microseconds
// during a decode step, and waking a sleeping thread costs tens of microseconds (more in a
// virtual machine), so a short spin keeps the workers on hand between a step's loops while
// costing an idle pool next to nothing.
constexpr auto spin_before_sleep = std::chrono::microseconds(200);

void cpu_relax() noexcept {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// Spins until `ready()` or the spin time is over; returns ready().
template <class Ready>
bool spin_until(const Ready& ready) {
  const auto deadline = std::chrono::steady_clock::now() + spin_before_sleep;
  for (int i = 0;; ++i) {
    if (ready()) return true;
    cpu_relax();
    // Reading the clock costs more than a pause: check it every so often.
    if ((i & 63) == 63 && std::chrono::steady_clock::now() >= deadline) return ready();
  }
}

}  // namespace

// One parallel_for call. Lives on the caller's stack; the caller keeps it alive until no
// worker refers to it.
struct thread_pool::parallel_job {
  chunk_function invoke = nullptr;
  const void* body = nullptr;
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t grain = 0;
  std::size_t chunk_count = 0;

  // The next chunk to hand out; any thread claims by incrementing, so each chunk is run once.
  // Values at or past chunk_count mean nothing is left.
  std::atomic<std::size_t> next_chunk{0};

  // Written under the pool's mutex; read without it by the caller spinning for the end.
  std::atomic<std::size_t> helpers{0};  // workers currently running this job's chunks

  // Guarded by the pool's mutex.
  std::exception_ptr error;           // the first exception a helper caught
  std::condition_variable helpers_done;  // signalled when helpers drops to 0
  parallel_job* next = nullptr;       // the pool's list of open jobs

  bool has_unclaimed_chunks() const noexcept {
    return next_chunk.load(std::memory_order_relaxed) < chunk_count;
  }

  // Claims and runs chunks until none is left, from whichever thread calls it. Returns the
  // exception a chunk threw, after which no further chunks are handed out to anyone.
  std::exception_ptr run_chunks() noexcept {
    for (;;) {
      const std::size_t chunk = next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (chunk >= chunk_count) return nullptr;
      const std::size_t chunk_begin = begin + chunk * grain;
      const std::size_t chunk_end = chunk_begin + std::min(grain, end - chunk_begin);
      try {
        invoke(body, chunk_begin, chunk_end);
      } catch (...) {
        next_chunk.store(chunk_count, std::memory_order_relaxed);
        return std::current_exception();
      }
    }
  }
};

thread_pool::thread_pool(std::size_t threads) {
  if (threads == 0) threads = std::max<std::size_t>(1, std::thread::hardware_concurrency());
  workers_.reserve(threads);
  try {
    for (std::size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  } catch (...) {
    stop_and_join();
    throw;
  }
}

thread_pool::~thread_pool() { stop_and_join(); }

void thread_pool::stop_and_join() noexcept {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_available_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void thread_pool::enqueue(std::unique_ptr<detail::pool_task> task) {
  {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(task));
    work_epoch_.fetch_add(1, std::memory_order_release);
  }
  work_available_.notify_one();
}

thread_pool::parallel_job* thread_pool::find_open_job() const noexcept {
  for (parallel_job* job = jobs_; job != nullptr; job = job->next) {
    if (job->has_unclaimed_chunks()) return job;
  }
  return nullptr;
}

void thread_pool::worker_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    // Loops first: their callers are blocked waiting, while a task's submitter usually is not.
    if (parallel_job* job = find_open_job()) {
      ++job->helpers;
      lock.unlock();
      std::exception_ptr error = job->run_chunks();
      lock.lock();
      if (error && !job->error) job->error = std::move(error);
      // Notified under the mutex: once the caller sees 0 it may return and destroy the job.
      if (--job->helpers == 0) job->helpers_done.notify_one();
      continue;
    }
    if (!tasks_.empty()) {
      std::unique_ptr<detail::pool_task> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task->run();
      task.reset();  // the task's captures are destroyed outside the lock too
      lock.lock();
      continue;
    }
    if (stopping_) return;
    // Nothing to do: spin a little for new work (announced by work_epoch_) before sleeping.
    const std::uint64_t seen = work_epoch_.load(std::memory_order_acquire);
    lock.unlock();
    spin_until([&] { return work_epoch_.load(std::memory_order_acquire) != seen; });
    lock.lock();
    work_available_.wait(lock, [&] { return stopping_ || work_epoch_.load(std::memory_order_relaxed) != seen; });
  }
}

void thread_pool::run_parallel_for(std::size_t begin, std::size_t end, std::size_t grain,
                                   chunk_function invoke, const void* body) {
  if (begin >= end) return;
  const std::size_t count = end - begin;
  if (grain == 0) {
    const std::size_t target_chunks = (size() + 1) * auto_chunks_per_thread;
    grain = std::max<std::size_t>(1, count / target_chunks + (count % target_chunks != 0 ? 1 : 0));
  }
  const std::size_t chunk_count = count / grain + (count % grain != 0 ? 1 : 0);
  if (chunk_count == 1) {
    invoke(body, begin, end);
    return;
  }

  parallel_job job;
  job.invoke = invoke;
  job.body = body;
  job.begin = begin;
  job.end = end;
  job.grain = grain;
  job.chunk_count = chunk_count;
  {
    std::lock_guard lock(mutex_);
    // Newest first, so workers help a nested loop before its enclosing one, which is waiting
    // on it anyway.
    job.next = jobs_;
    jobs_ = &job;
    work_epoch_.fetch_add(1, std::memory_order_release);
  }
  // Wake only as many workers as there are chunks beyond the one this thread takes.
  const std::size_t wanted_helpers = std::min(chunk_count - 1, size());
  for (std::size_t i = 0; i < wanted_helpers; ++i) work_available_.notify_one();

  std::exception_ptr error = job.run_chunks();
  // Helpers usually finish within microseconds of the caller: spin before sleeping on it.
  spin_until([&job] { return job.helpers.load(std::memory_order_acquire) == 0; });

  {
    std::unique_lock lock(mutex_);
    parallel_job** link = &jobs_;
    while (*link != &job) link = &(*link)->next;
    *link = job.next;
    // Every chunk is claimed by now; the helpers still counted are finishing theirs.
    job.helpers_done.wait(lock, [&job] { return job.helpers == 0; });
    if (!error) error = std::move(job.error);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace edge
