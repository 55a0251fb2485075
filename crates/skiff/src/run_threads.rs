//! Threads for a direct fan-out. Each runs a single-threaded tokio runtime,
//! and a host's connection stays on the runtime it was dealt to, so that the
//! connection's tasks never wake each other across threads (on a
//! work-stealing runtime those wake-ups cost more CPU than they save).

use std::sync::mpsc;
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Running threads, stopped when dropped.
pub struct Workers {
    handles: Vec<Handle>,
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts `count` threads, each with its own runtime.
    pub fn start(count: usize) -> std::io::Result<Workers> {
        let mut workers = Workers {
            handles: Vec::with_capacity(count),
            stops: Vec::with_capacity(count),
            threads: Vec::with_capacity(count),
        };
        for n in 0..count {
            let (ready_tx, ready_rx) = mpsc::channel();
            let thread = std::thread::Builder::new()
                .name(format!("skiff-run-{n}"))
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let (stop_tx, stop_rx) = oneshot::channel::<()>();
                    let _ = ready_tx.send(Ok((runtime.handle().clone(), stop_tx)));
                    runtime.block_on(async {
                        let _ = stop_rx.await;
                    });
                    runtime.shutdown_background();
                })?;
            workers.threads.push(thread);
            let ready = ready_rx
                .recv()
                .map_err(|_| std::io::Error::other("a fan-out thread ended at start"))?;
            let (handle, stop) = ready?;
            workers.handles.push(handle);
            workers.stops.push(stop);
        }
        Ok(workers)
    }

    /// The threads' runtimes.
    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}
