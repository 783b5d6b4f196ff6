//! A loopback TCP relay that can be told to stop forwarding, in both
//! directions and for new connections too: a peer that froze (SIGSTOP) or
//! sits behind a network black hole, without touching the real server
//! other tests share. It can also hold back what the server sends for a
//! while and then deliver it: a server whose answers arrive late after it
//! has acted on the request (a commit acknowledged seconds later). And it
//! can lose the answer to one request for good: a server that acted on a
//! request whose answer never came back (a client retry meets its own
//! write).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Bytes read from one side before they are written to the other.
const CHUNK_BYTES_MAX: usize = 16 * 1024;

/// A relay from a loopback port to `target`; it stops with the value.
pub struct Relay {
    addr: SocketAddr,
    frozen: watch::Sender<bool>,
    reply_delay: watch::Sender<Duration>,
    /// Reply chunks still to deliver at once before the delay applies.
    skip: Arc<AtomicUsize>,
    loss: Arc<Loss>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Listens on an ephemeral loopback port and forwards every connection
    /// to `target`.
    pub async fn start(target: SocketAddr) -> io::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (frozen, watching) = watch::channel(false);
        let (reply_delay, delaying) = watch::channel(Duration::ZERO);
        let skip = Arc::new(AtomicUsize::new(0));
        let loss = Arc::new(Loss::default());
        let task = tokio::spawn(accept(
            listener,
            target,
            watching,
            (delaying, skip.clone()),
            loss.clone(),
        ));
        Ok(Relay {
            addr,
            frozen,
            reply_delay,
            skip,
            loss,
            task,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on nothing is forwarded: bytes in flight are held, never
    /// delivered, and new connections are accepted and then ignored. The
    /// sockets stay open, so neither side sees an error.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// New connections are forwarded again; connections that saw the
    /// freeze stay silent, as a connection whose bytes were lost would.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// From now on every chunk the server sends, on every connection, is
    /// held for `delay` before it is delivered (in order; a chunk behind a
    /// held one waits for it). What the client sends still goes at once,
    /// so the server acts on a request long before its answer arrives.
    /// `Duration::ZERO` delivers later chunks at once again.
    pub fn delay_replies(&self, delay: Duration) {
        self.delay_replies_after(0, delay);
    }

    /// As [`Relay::delay_replies`], but the next `skip` chunks the server
    /// sends (on any connection) are delivered at once first: to hold the
    /// answer to a client's second request and not its first.
    pub fn delay_replies_after(&self, skip: usize, delay: Duration) {
        self.skip.store(skip, Ordering::SeqCst);
        self.reply_delay.send_replace(delay);
    }

    /// The next request whose bytes hold `marker` (on any connection) is
    /// delivered, and nothing the server sends on its connection from then
    /// on is: the server acts on it, and its answer is lost. The
    /// connection stays open and silent until the client gives up on it;
    /// other connections, and the connections that follow, are relayed as
    /// before. Told again before a request held the marker, the new marker
    /// replaces the old.
    pub fn lose_answer_to(&self, marker: &[u8]) {
        *self.loss.armed() = Some(marker.to_vec());
    }

    /// How many answers [`Relay::lose_answer_to`] has lost so far: the
    /// requests that held their marker.
    pub fn answers_lost(&self) -> usize {
        self.loss.lost.load(Ordering::SeqCst)
    }
}

/// The answer [`Relay::lose_answer_to`] is to lose.
#[derive(Default)]
struct Loss {
    /// The marker of the request whose answer is lost, until one holds it.
    marker: Mutex<Option<Vec<u8>>>,
    /// How many requests held it.
    lost: AtomicUsize,
}

impl Loss {
    fn armed(&self) -> MutexGuard<'_, Option<Vec<u8>>> {
        // Each use is one assignment or take: a panic cannot leave it half done.
        self.marker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether `request` is the one whose answer is lost; it disarms the
    /// marker if so.
    fn takes(&self, request: &[u8]) -> bool {
        let mut armed = self.armed();
        let held = armed
            .as_deref()
            .is_some_and(|m| !m.is_empty() && request.windows(m.len()).any(|w| w == m));
        if held {
            *armed = None;
            self.lost.fetch_add(1, Ordering::SeqCst);
        }
        held
    }
}

/// One direction of a relayed connection, and what it may do to the bytes.
enum Direction {
    /// Client to server: a request that holds the lost marker makes the
    /// connection deaf before it is delivered.
    Requests {
        loss: Arc<Loss>,
        deaf: Arc<AtomicBool>,
    },
    /// Server to client: each chunk waits the delay in force when it was
    /// read, and none is delivered once the connection is deaf.
    Replies {
        delay: (watch::Receiver<Duration>, Arc<AtomicUsize>),
        deaf: Arc<AtomicBool>,
    },
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(
    listener: TcpListener,
    target: SocketAddr,
    frozen: watch::Receiver<bool>,
    reply_delay: (watch::Receiver<Duration>, Arc<AtomicUsize>),
    loss: Arc<Loss>,
) {
    while let Ok((client, _)) = listener.accept().await {
        let frozen = frozen.clone();
        let reply_delay = reply_delay.clone();
        let loss = loss.clone();
        tokio::spawn(async move {
            if *frozen.borrow() {
                hold(client).await;
                return;
            }
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let deaf = Arc::new(AtomicBool::new(false));
            let requests = Direction::Requests {
                loss,
                deaf: deaf.clone(),
            };
            let replies = Direction::Replies {
                delay: reply_delay,
                deaf,
            };
            tokio::join!(
                pipe(client_read, server_write, frozen.clone(), requests),
                pipe(server_read, client_write, frozen, replies),
            );
        });
    }
}

/// Copies `from` to `to` until either ends or the relay freezes; after a
/// freeze both halves are held open forever. What else happens to each
/// chunk depends on its `direction`.
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    frozen: watch::Receiver<bool>,
    direction: Direction,
) {
    let mut buf = vec![0; CHUNK_BYTES_MAX];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        match &direction {
            // Deaf before the request goes on: its answer cannot overtake.
            Direction::Requests { loss, deaf } => {
                if loss.takes(&buf[..n]) {
                    deaf.store(true, Ordering::SeqCst);
                }
            }
            Direction::Replies { deaf, .. } if deaf.load(Ordering::SeqCst) => continue,
            Direction::Replies {
                delay: (delay, skip),
                ..
            } => {
                let hold = *delay.borrow();
                let skipped = !hold.is_zero()
                    && skip
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                if !hold.is_zero() && !skipped {
                    tokio::time::sleep(hold).await;
                }
            }
        }
        if *frozen.borrow() {
            hold((from, to)).await;
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Keeps `sockets` open and silent until the relay is dropped.
async fn hold<T>(sockets: T) {
    let _held = sockets;
    std::future::pending::<()>().await
}
