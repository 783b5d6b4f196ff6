//! The suspect window (`idem_core::window`): kept by the store, opened and
//! extended atomically against the store's clock, never shortened.

use std::sync::Arc;

use idem_core::{Clock, ManualClock, Store, SuspectWindow, WindowOpening};

fn opening(length_ms: u64, since: Option<u64>, cause: &str) -> WindowOpening {
    WindowOpening {
        length_ms,
        since: since.map(idem_core::Timestamp::from_millis),
        cause: cause.into(),
    }
}

/// No window until one is opened; opening one keeps it as
/// [`SuspectWindow::opened`] says, against the store's clock; opening it
/// again while it is open extends it and never shortens it; once it has
/// closed, the next opening starts a new one; the version counts every
/// opening.
pub async fn suspect_window_is_kept_and_only_extended<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    assert_eq!(store.suspect_window().await, Ok(None), "none at first");
    let first = opening(10_000, Some(5), "restored");
    let opened = store.open_suspect_window(&first).await.unwrap();
    let expect = SuspectWindow::opened(None, &first, clock.now());
    assert_eq!(opened, expect, "the first opening");
    assert_eq!(store.suspect_window().await, Ok(Some(expect.clone())));

    clock.advance_millis(1_000);
    let shorter = opening(10, None, "promotion");
    let extended = store.open_suspect_window(&shorter).await.unwrap();
    let want = SuspectWindow::opened(Some(&expect), &shorter, clock.now());
    assert_eq!(extended, want, "an open window is extended");
    assert_eq!(extended.until, expect.until, "never shortened");
    assert_eq!(extended.version, 2);
    assert_eq!(store.suspect_window().await, Ok(Some(want.clone())));

    clock.advance_millis(9_000);
    assert!(!want.is_open(clock.now()), "closed now");
    assert_eq!(
        store.suspect_window().await,
        Ok(Some(want.clone())),
        "a closed window is still kept"
    );
    let again = opening(500, None, "restored again");
    let renewed = store.open_suspect_window(&again).await.unwrap();
    assert_eq!(
        renewed,
        SuspectWindow::opened(Some(&want), &again, clock.now())
    );
    assert_eq!((renewed.opened_at, renewed.version), (clock.now(), 3));
}

/// Openings racing each other are applied one after another: each sees
/// the one before it, so the versions are 1 to N and the window ends at
/// the latest of their ends.
pub async fn concurrent_window_openings_are_serialised<S: Store + 'static>(
    store: Arc<S>,
    clock: ManualClock,
) {
    const N: u64 = 16;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..N {
        let store = Arc::clone(&store);
        tasks.spawn(async move {
            let o = opening(1_000 + i, None, &format!("opening {i}"));
            store.open_suspect_window(&o).await.unwrap()
        });
    }
    let mut versions: Vec<u64> = tasks.join_all().await.iter().map(|w| w.version).collect();
    versions.sort_unstable();
    assert_eq!(versions, (1..=N).collect::<Vec<_>>(), "one after another");
    let held = store.suspect_window().await.unwrap().unwrap();
    assert_eq!(held.until, clock.now().plus_millis(1_000 + N - 1));
    assert_eq!(held.version, N);
}
