//! The accept loop the gateway's listeners and the probes serve with, because
//! `axum::serve` bounds nothing: here every phase of a connection has a
//! deadline (TLS handshake; the request head and the keep-alive wait
//! before it, through hyper's header-read timer), each listener caps its
//! own connections, and a graceful stop lets requests in flight finish
//! while idle connections close.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::convert::Infallible;

use axum::body::Body;
use axum::response::Response;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::log_budget::{LogBudget, Logged};
use tower::ServiceExt;

/// What one connection buffers of what it reads, in bytes: a request head
/// that is still incomplete once this much is buffered is answered 431
/// (hyper's default, about 400 KiB, let each half-sent head hold that
/// much).
pub const READ_BUFFER_BYTES_MAX: usize = 64 * 1024;
/// At most one warning per this many milliseconds says a listener is
/// closing connections at its cap (each one is logged at debug).
pub const CAP_WARNING_INTERVAL_MS: u64 = 10_000;
/// How long connections may go on after the response timeout once the
/// drain has begun, in milliseconds: a request in flight has had its
/// whole exchange by then and its record written, so what is left is a
/// client that does not read its answer, which must not hold the
/// process forever.
pub const DRAIN_GRACE_MS: u64 = 5_000;
/// How long a request body the answer left unread is still read (and
/// thrown away) after it, in milliseconds, so that a client still sending
/// it reads the answer. See [`LINGER_BYTES_MAX`].
pub const LINGER_MS: u64 = 5_000;
/// How much of a request body the answer left unread is still read, in
/// bytes: a client sending more than this after its refusal is closed.
pub const LINGER_BYTES_MAX: usize = 16 * 1024 * 1024;
/// How long a body the answer left unread may go without a byte before the
/// connection is closed anyway, in milliseconds: a body that stalled (its
/// answer was the body-read timeout) is not waited for a second time.
pub const LINGER_GAP_MS: u64 = 500;
/// How long the accept loop pauses after an error that is not one
/// client's (too many open files): retrying at once would spin.
pub const ACCEPT_ERROR_PAUSE_MS: u64 = 100;

/// The bounds one listener keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections served at once; one more is closed as soon as it is
    /// accepted.
    pub connections_max: usize,
    /// Time from a connection's start (after its TLS handshake), or from
    /// the end of its previous response, to the last byte of a request
    /// head. It bounds a half-sent head and an idle keep-alive connection.
    pub header_read_timeout: Duration,
    /// Time a client has to finish its TLS handshake (TLS listeners only).
    pub tls_handshake_timeout: Duration,
}

/// What a listener speaks over TCP.
#[derive(Clone)]
pub enum Transport {
    /// HTTP/1.1 in the clear.
    Plain,
    /// HTTP/1.1 over TLS, the handshake run by the connection's own task.
    Tls(TlsAcceptor),
}

/// What a listener serves: an axum `Router` (the admin API), or the
/// proxy's service stack itself, which needs no router in front of it.
pub trait App:
    tower::Service<http::Request<Body>, Response = Response, Error = Infallible, Future: Send>
    + Clone
    + Send
    + 'static
{
}

impl<S> App for S where
    S: tower::Service<http::Request<Body>, Response = Response, Error = Infallible, Future: Send>
        + Clone
        + Send
        + 'static
{
}

/// Serves `app` on `listener` until `shutdown` resolves; then stops
/// accepting, lets every request in flight finish, closes idle
/// connections and returns once every connection has ended, or at `drain`
/// after the stop, closing those still open. `name` names the listener in
/// logs.
pub async fn serve<A: App>(
    name: &'static str,
    listener: TcpListener,
    transport: Transport,
    app: A,
    (limits, drain): (ConnectionLimits, Duration),
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let room = Arc::new(Semaphore::new(limits.connections_max));
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let refused = Refused::default();
    tokio::pin!(shutdown);
    loop {
        // Finished connections are reaped as the loop goes, so the set
        // holds only live ones.
        while connections.try_join_next().is_some() {}
        let (stream, addr) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    pause_after(name, &e).await;
                    continue;
                }
            },
        };
        // Closed at once rather than left in the backlog: the client
        // learns now, and the slots of the others stay theirs.
        let Ok(permit) = room.clone().try_acquire_owned() else {
            drop(stream);
            refused.note(name, addr, limits.connections_max);
            continue;
        };
        let connection = Connection {
            name,
            transport: transport.clone(),
            app: app.clone(),
            limits,
            drain: drain_rx.clone(),
            _permit: permit,
        };
        connections.spawn(connection.run(stream));
    }
    drop(listener);
    let _ = drain_tx.send(true);
    let deadline = tokio::time::sleep(drain);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            next = connections.join_next() => if next.is_none() { break },
            () = &mut deadline => {
                // Closed, not waited for: an attempt cut here stays in
                // progress and becomes ambiguous, never re-executed.
                tracing::warn!(
                    listener = name,
                    connections = connections.len(),
                    drain_ms = drain.as_millis(),
                    "closing the connections still open at the drain deadline \
                     (clients that do not read their answers)"
                );
                connections.shutdown().await;
                break;
            }
        }
    }
    Ok(())
}

/// One accepted connection and what it needs to be served on its own.
struct Connection<A> {
    name: &'static str,
    transport: Transport,
    app: A,
    limits: ConnectionLimits,
    drain: watch::Receiver<bool>,
    /// Its place under `connections_max`, given back when it ends.
    _permit: OwnedSemaphorePermit,
}

impl<A: App> Connection<A> {
    /// Handshakes (TLS) and serves the connection to its end; a stop
    /// before the handshake is done drops it.
    async fn run(mut self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        match self.transport.clone() {
            Transport::Plain => self.http(stream).await,
            Transport::Tls(acceptor) => {
                let timeout = self.limits.tls_handshake_timeout;
                let handshake = tokio::time::timeout(timeout, acceptor.accept(stream));
                let tls = tokio::select! {
                    done = handshake => done,
                    () = drained(&mut self.drain) => return,
                };
                match tls {
                    Ok(Ok(tls)) => self.http(tls).await,
                    Ok(Err(e)) => {
                        tracing::debug!(listener = self.name, error = %e, "TLS handshake failed");
                    }
                    Err(_) => tracing::debug!(
                        listener = self.name,
                        tls_handshake_timeout_ms = timeout.as_millis(),
                        "TLS handshake timed out"
                    ),
                }
            }
        }
    }

    /// HTTP/1.1 over `io`, with hyper's timer on, so that its head
    /// deadline holds; on the stop signal it finishes the request in
    /// flight, if any, and closes.
    async fn http<I>(mut self, io: I)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let app = self.app.clone();
        let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
            let answered = app
                .clone()
                .oneshot(req.map(|body| Body::new(Lingering(Some(body)))));
            async move {
                let mut response = answered.await?;
                // The version is this connection's, whatever made the
                // answer: an upstream's HTTP/1.0 left on it would make
                // hyper write `HTTP/1.0` and close a kept connection.
                // hyper itself answers a client that speaks HTTP/1.0 in
                // HTTP/1.0.
                *response.version_mut() = http::Version::HTTP_11;
                Ok::<_, Infallible>(response)
            }
        });
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_read_timeout)
            .max_buf_size(READ_BUFFER_BYTES_MAX)
            .keep_alive(true);
        // The answer's writes share the head's bound: a client that reads
        // nothing of its answer for that long is closed, not waited for.
        let io = WriteStall::new(io, self.limits.header_read_timeout);
        let connection = builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(connection);
        let served = tokio::select! {
            served = connection.as_mut() => served,
            () = drained(&mut self.drain) => {
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        if let Err(e) = served {
            // A client that hangs up or is too slow ends only its own
            // connection; nothing to report above debug.
            tracing::debug!(listener = self.name, error = %e, "connection ended");
        }
    }
}

/// A request body that, dropped before its end (the answer did not need
/// it: a refusal, a body over its limit), is read to its end and thrown
/// away on a task of its own, within [`LINGER_MS`] and [`LINGER_BYTES_MAX`].
/// The connection goes on reading while the refusal is written, so a client
/// still sending reads the refusal: closing under it would answer its
/// writes with a reset that loses the refusal (nginx's lingering close).
struct Lingering(Option<Incoming>);

impl hyper::body::Body for Lingering {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        match self.0.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.as_ref().is_none_or(hyper::body::Body::is_end_stream)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.0.as_ref().map_or_else(
            || hyper::body::SizeHint::with_exact(0),
            hyper::body::Body::size_hint,
        )
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let Some(body) = self.0.take() else { return };
        if hyper::body::Body::is_end_stream(&body) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(linger(body));
        }
    }
}

/// Reads `body` to its end, or until [`LINGER_MS`] or [`LINGER_BYTES_MAX`]
/// is spent or nothing came for [`LINGER_GAP_MS`], and drops what it read;
/// a client that sends more, or stalls, is closed.
async fn linger(mut body: Incoming) {
    let mut read = 0usize;
    let gap = Duration::from_millis(LINGER_GAP_MS);
    let drain = async {
        loop {
            let next =
                std::future::poll_fn(|cx| hyper::body::Body::poll_frame(Pin::new(&mut body), cx));
            let Ok(Some(Ok(frame))) = tokio::time::timeout(gap, next).await else {
                return;
            };
            read += frame.data_ref().map_or(0, bytes::Bytes::len);
            if read > LINGER_BYTES_MAX {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(LINGER_MS), drain).await;
}

/// The warning that a listener closes connections at its cap: at most one
/// per [`CAP_WARNING_INTERVAL_MS`], saying how many were closed since.
struct Refused(LogBudget);

impl Default for Refused {
    fn default() -> Refused {
        Refused(LogBudget::new(
            1,
            Duration::from_millis(CAP_WARNING_INTERVAL_MS),
        ))
    }
}

impl Refused {
    /// Counts one, logs it at debug, and warns within the budget, so a
    /// flood is visible but not written line by line.
    fn note(&self, name: &'static str, addr: std::net::SocketAddr, connections_max: usize) {
        tracing::debug!(listener = name, %addr, connections_max, "connection closed at the cap");
        if let Logged::Write { suppressed } = self.0.admit(std::time::Instant::now()) {
            tracing::warn!(
                listener = name,
                connections_max,
                closed = suppressed + 1,
                "the listener serves as many connections as it may: closing new ones at once"
            );
        }
    }
}

/// Resolves once the stop is signalled or its sender is gone.
async fn drained(drain: &mut watch::Receiver<bool>) {
    let _ = drain.wait_for(|stop| *stop).await;
}

/// Waits out an accept error: at once for one client's (it hung up before
/// being accepted), [`ACCEPT_ERROR_PAUSE_MS`] for the process's (no
/// descriptor left), logged.
async fn pause_after(name: &'static str, e: &std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
    ) {
        return;
    }
    tracing::error!(listener = name, error = %e, "cannot accept a connection");
    tokio::time::sleep(Duration::from_millis(ACCEPT_ERROR_PAUSE_MS)).await;
}

/// `io` whose writes fail once none has made progress for `limit`, so a
/// client that stops reading its answer (hyper writes it, and reads no
/// next head meanwhile) holds its connection and the answer's memory only
/// that long. Reads pass through: their bounds are hyper's head timer and
/// the body deadline.
struct WriteStall<I> {
    io: I,
    limit: Duration,
    /// Armed when a write first finds no room, disarmed by any progress.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<I> WriteStall<I> {
    fn new(io: I, limit: Duration) -> WriteStall<I> {
        WriteStall {
            io,
            limit,
            stalled: None,
        }
    }

    /// Called when the inner write is pending: pending until `limit` has
    /// passed with no progress, then the error that ends the connection.
    fn stall<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client read nothing of its answer for {} ms (header_read_timeout_ms)",
                    limit.as_millis()
                ),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// The inner write's outcome: progress disarms the timer.
    fn progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => self.stall(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for WriteStall<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for WriteStall<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.progress(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.progress(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        self.progress(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
