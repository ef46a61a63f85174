// A fixed-size pool of worker threads for CPU work: queued one-off tasks (submit) and
// fork-join loops over an index range (parallel_for), which the CPU executor runs many times per
// decode step (matmul rows, attention heads).
//
// parallel_for is built for that rate: the job descriptor lives on the caller's stack, workers
// claim chunks from it through one atomic counter, and nothing is allocated per call or per
// chunk. The calling thread works on its own loop too, so a call made from inside a pool task
// (a nested loop) always makes progress and cannot deadlock, even on a pool of one thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstddef>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace edge {

namespace detail {

// A queued one-off task. Type-erased by hand because the packaged_task inside is move-only,
// which std::function cannot hold.
class pool_task {
 public:
  virtual ~pool_task() = default;
  virtual void run() = 0;
};

template <class Fn>
class pool_task_of final : public pool_task {
 public:
  explicit pool_task_of(Fn fn) : fn_(std::move(fn)) {}
  void run() override { fn_(); }

 private:
  Fn fn_;
};

}  // namespace detail

class thread_pool {
 public:
  // Starts `threads` workers; 0 means one per hardware thread. Throws std::system_error when
  // the threads cannot be started.
  explicit thread_pool(std::size_t threads);

  // Runs every task already submitted (and any they submit in turn), then joins the workers.
  // No parallel_for may be in progress and no other thread may submit while this runs.
  ~thread_pool();

  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  // The number of worker threads; fixed at construction, so any thread may ask.
  std::size_t size() const noexcept { return workers_.size(); }

  // Queues `f` to run once on a worker and returns a future for its result; an exception
  // thrown by `f` is rethrown by the future's get(). Any thread may submit, workers included,
  // but a task that waits on the future of another task can deadlock a pool whose workers are
  // all waiting likewise.
  template <class F>
  auto submit(F&& f) -> std::future<std::invoke_result_t<F>> {
    using result_type = std::invoke_result_t<F>;
    std::packaged_task<result_type()> task(std::forward<F>(f));
    std::future<result_type> future = task.get_future();
    enqueue(std::make_unique<detail::pool_task_of<std::packaged_task<result_type()>>>(std::move(task)));
    return future;
  }

  // Calls body(chunk_begin, chunk_end) over disjoint chunks of at most `grain` indices that
  // together cover [begin, end), on the workers and the calling thread, and returns when every
  // chunk has finished. `grain` 0 picks a few chunks per thread. Chunks may run in any order
  // and concurrently, so `body` must be safe to call from several threads at once.
  //
  // Any thread may call this, several at once, and from inside a pool task or another
  // parallel_for body. If a chunk throws, chunks not yet claimed by a thread are skipped and
  // the first exception is rethrown here once every started chunk has finished.
  template <class F>
  void parallel_for(std::size_t begin, std::size_t end, std::size_t grain, const F& body) {
    run_parallel_for(begin, end, grain, &invoke_chunk<F>, &body);
  }

 private:
  struct parallel_job;
  using chunk_function = void (*)(const void* body, std::size_t chunk_begin, std::size_t chunk_end);

  template <class F>
  static void invoke_chunk(const void* body, std::size_t chunk_begin, std::size_t chunk_end) {
    (*static_cast<const F*>(body))(chunk_begin, chunk_end);
  }

  void enqueue(std::unique_ptr<detail::pool_task> task);
  void run_parallel_for(std::size_t begin, std::size_t end, std::size_t grain, chunk_function invoke,
                        const void* body);
  void worker_loop();
  parallel_job* find_open_job() const noexcept;  // requires mutex_
  void stop_and_join() noexcept;

  // Guards everything below it. Workers sleep on work_available_ until a task is queued, a
  // parallel_for job has unclaimed chunks, or the pool is stopping.
  std::mutex mutex_;
  std::condition_variable work_available_;
  std::deque<std::unique_ptr<detail::pool_task>> tasks_;  // FIFO
  // parallel_for jobs still handing out chunks, linked through parallel_job::next; each lives
  // on its caller's stack and is unlinked by that caller before it returns.
  parallel_job* jobs_ = nullptr;
  bool stopping_ = false;
  // Counts announcements of new work (a task queued, a loop opened). Written under the mutex;
  // idle workers read it without the mutex while they spin before sleeping.
  std::atomic<std::uint64_t> work_epoch_{0};

  // Written only by the constructor and destructor.
  std::vector<std::thread> workers_;
};

}  // namespace edge
