//! Completions of waited-on keys, heard from other processes: one
//! connection of its own `LISTEN`s on the schema's channel, which the
//! completion statement notifies for every key a request noted waiting on
//! (`Store::note_waiting`), and calls the registered wake with each
//! record. A connection that ends is opened again after a second; waiters
//! poll meanwhile, so a lost notification only delays them.

use std::time::Duration;

use idem_core::{IdempotencyKey, RecordId, Scope, WakeFn};
use tokio_postgres::{AsyncMessage, NoTls};

/// The pause before a listener connection that ended is opened again.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// Listens on `channel` through a connection made from `pg` for as long
/// as the runtime lives, calling `wake` for each completed record.
pub(crate) fn spawn(pg: tokio_postgres::Config, channel: String, wake: WakeFn) {
    tokio::spawn(async move {
        loop {
            // An error only means this connection ended; the next try says
            // nothing new until the server answers again.
            let _ended = listen_once(&pg, &channel, &wake).await;
            tokio::time::sleep(RECONNECT_AFTER).await;
        }
    });
}

async fn listen_once(
    pg: &tokio_postgres::Config,
    channel: &str,
    wake: &WakeFn,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = pg.connect(NoTls).await?;
    let heard = wake.clone();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if let Some(id) = record_of(n.payload()) {
                        heard(&id);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            }
        }
    });
    client.batch_execute(&format!("LISTEN {channel}")).await?;
    // The client must live as long as the connection listens.
    let _ = driver.await;
    drop(client);
    Ok(())
}

/// The record a notification names: `scope`, a newline, `key`.
fn record_of(payload: &str) -> Option<RecordId> {
    let (scope, key) = payload.split_once('\n')?;
    Some(RecordId {
        scope: Scope::new(scope).ok()?,
        key: IdempotencyKey::new(key).ok()?,
    })
}
