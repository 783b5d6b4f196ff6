//! The in-flight slot a request holds while it is worked on, carried in
//! its extensions so that the layer can give it back while the request
//! only waits for another attempt's outcome: a waiter holds its own budget
//! (`WaitLimits`), never the capacity that serves work, so one key's retry
//! storm cannot refuse another tenant's fresh request.

use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One request's claim on a limit of requests in flight (`slots`, a
/// semaphore with one permit per slot). Whoever takes it (the gateway's
/// edge) puts a clone in the request's extensions and calls
/// [`InFlightSlot::give_back`] when the request is answered; the layer
/// gives it back while the request waits and takes it again before the
/// request goes on to work (docs/http.md, "Waiting for the original").
#[derive(Clone, Debug)]
pub struct InFlightSlot {
    state: Arc<SlotState>,
}

#[derive(Debug)]
struct SlotState {
    slots: Arc<Semaphore>,
    /// `None` while given back.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
}

impl InFlightSlot {
    /// Takes one of `slots` at once, or `None` when all are taken: a
    /// request that finds none is answered at once, never queued.
    pub fn try_take(slots: &Arc<Semaphore>) -> Option<InFlightSlot> {
        let permit = slots.clone().try_acquire_owned().ok()?;
        Some(InFlightSlot {
            state: Arc::new(SlotState {
                slots: slots.clone(),
                permit: Mutex::new(Some(permit)),
            }),
        })
    }

    /// Gives the slot back (nothing when it is already given back).
    pub fn give_back(&self) {
        let permit = self.permit().take();
        drop(permit);
    }

    /// Holds a slot again, taking one at once if it was given back;
    /// `false` when it was given back and all slots are taken.
    pub fn take_again(&self) -> bool {
        let mut permit = self.permit();
        if permit.is_none() {
            *permit = self.state.slots.clone().try_acquire_owned().ok();
        }
        permit.is_some()
    }

    fn permit(&self) -> std::sync::MutexGuard<'_, Option<OwnedSemaphorePermit>> {
        // A panic while holding this lock left the option whole.
        self.state.permit.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_given_back_serves_another_and_is_taken_again_only_if_free() {
        let slots = Arc::new(Semaphore::new(1));
        let waiter = InFlightSlot::try_take(&slots).unwrap();
        assert!(InFlightSlot::try_take(&slots).is_none(), "all taken");
        waiter.give_back();
        waiter.give_back();
        let fresh = InFlightSlot::try_take(&slots).unwrap();
        assert!(!waiter.take_again(), "the fresh request holds it");
        fresh.give_back();
        assert!(waiter.take_again());
        assert!(waiter.take_again(), "held already");
        assert_eq!(slots.available_permits(), 0);
        waiter.give_back();
        assert_eq!(slots.available_permits(), 1);
    }
}
