//! A server under test on its own tokio runtime: binds a loopback port,
//! runs until told to stop, and stops within a bound. The upstream and the
//! gateway both run this way, so that each has the threads it is given and
//! no more.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a server may take to drain and stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Resolves when the server should stop accepting and drain.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A running server.
pub struct Server {
    name: &'static str,
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    runtime: Option<Runtime>,
}

impl Server {
    /// Binds `addr` (which must be a loopback address) and runs `serve` on a
    /// new runtime with `workers` worker threads.
    pub fn start<F, Fut>(
        name: &'static str,
        workers: usize,
        addr: SocketAddr,
        serve: F,
    ) -> anyhow::Result<Server>
    where
        F: FnOnce(TcpListener, Shutdown) -> Fut,
        Fut: Future<Output = std::io::Result<()>> + Send + 'static,
    {
        if !addr.ip().is_loopback() {
            bail!("{name}: {addr} is not a loopback address");
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name(name)
            .enable_all()
            .build()
            .with_context(|| format!("{name}: cannot start a runtime"))?;
        let listener = std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .with_context(|| format!("{name}: cannot listen on {addr}"))?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown: Shutdown = Box::pin(async move {
            let _ = stopped.await;
        });
        let task = {
            let _context = runtime.enter();
            let listener = TcpListener::from_std(listener)?;
            runtime.spawn(serve(listener, shutdown))
        };
        Ok(Server {
            name,
            addr,
            shutdown: Some(stop),
            task: Some(task),
            runtime: Some(runtime),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, waits up to [`STOP_TIMEOUT`] for in-flight work to
    /// finish, and reports how the server ended.
    pub fn stop(mut self) -> anyhow::Result<()> {
        let name = self.name;
        self.shutdown.take().map(|stop| stop.send(()));
        let (Some(runtime), Some(task)) = (self.runtime.take(), self.task.take()) else {
            return Ok(());
        };
        let ended = runtime.block_on(async { tokio::time::timeout(STOP_TIMEOUT, task).await });
        runtime.shutdown_timeout(STOP_TIMEOUT);
        match ended {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(e).with_context(|| format!("{name} stopped with an error")),
            Ok(Err(e)) => Err(e).with_context(|| format!("{name} panicked")),
            Err(_) => bail!("{name} did not stop within {} s", STOP_TIMEOUT.as_secs()),
        }
    }
}

impl Drop for Server {
    /// On an early return: stop without waiting for a drain.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(STOP_TIMEOUT);
        }
    }
}
