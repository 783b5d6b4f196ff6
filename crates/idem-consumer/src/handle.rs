//! One message through the contract: read its intent, claim it, deliver
//! it to the endpoint only when this delivery acquired the record, record
//! what the answer means, and turn the outcome into a settlement (the
//! settle table in docs/consumers.md).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderName, HeaderValue};
use idem_broker::{Message, Reason};
use idem_core::{AttemptOutcome, SettleOnRetry, Store, VerifyFresh, WindowWatch};
use idem_message::{Done, IntentSpec, Outcome, RejectReason, Reply, RunOnce, Sink};

use crate::config::Subscription;
use crate::deliver::Endpoint;
use crate::pump::{Handler, Settlement};

/// The content type a message is delivered with when it carries none.
const CONTENT_TYPE_DEFAULT: &str = "application/json";

/// A subscription's handler: its intent rules, its runner and its endpoint.
pub struct Subscriber {
    name: String,
    intent: IntentSpec,
    run: RunOnce,
    endpoint: Endpoint,
    key_header: HeaderName,
    message_bytes_max: usize,
    retry_after_max: Duration,
    max_deliveries: Option<u64>,
}

impl Subscriber {
    /// The handler of `sub` over `store`, labelling records with `owner`
    /// and, when there is one, `region`; `settler` (the reconciler) settles
    /// an ambiguous record a delivery meets, as the gateway's layer does.
    pub fn new(
        sub: &Subscription,
        store: Arc<dyn Store>,
        (owner, region): (&str, Option<&str>),
        (window, verifier): (Arc<WindowWatch>, Option<Arc<dyn VerifyFresh>>),
        settler: Option<Arc<dyn SettleOnRetry>>,
    ) -> Result<Subscriber, String> {
        let mut run = RunOnce::new(store, sub.policy, sub.completion.clone())
            .with_wait(sub.wait)
            .with_suspect_window(window, verifier)
            .with_owner(owner)
            .map_err(|e| format!("owner {owner:?}: {e}"))?;
        if let Some(region) = region {
            run = run.with_region(region).map_err(|e| e.to_string())?;
        }
        if let Some(settler) = settler {
            run = run.with_settle_on_retry(settler);
        }
        Ok(Subscriber {
            name: sub.name.clone(),
            intent: sub.intent.clone(),
            run,
            endpoint: Endpoint::new(
                sub.deliver.clone(),
                sub.connect_timeout,
                sub.response_timeout,
            ),
            key_header: sub.key_header.clone(),
            message_bytes_max: sub.message_bytes_max,
            retry_after_max: sub.retry_after_max,
            max_deliveries: sub.max_deliveries,
        })
    }

    /// The settlement of `m`, with the delivery limit applied: a message
    /// that is still not final after `max_deliveries` goes to the
    /// dead-letter destination rather than be dropped by the broker.
    async fn settle(&self, m: &Message) -> Settlement {
        let settlement = self.decide(m).await;
        match (settlement, self.max_deliveries) {
            (Settlement::Retry { .. }, Some(max)) if m.delivery >= max => {
                Settlement::DeadLetter(Reason {
                    code: "undecided".into(),
                    detail: format!(
                        "not final after {} deliveries (max_deliveries {max}); redrive it once \
                         its record is final: it will be acknowledged as a replay or run",
                        m.delivery
                    ),
                })
            }
            (settlement, _) => settlement,
        }
    }

    async fn decide(&self, m: &Message) -> Settlement {
        if m.payload.len() > self.message_bytes_max {
            return Settlement::DeadLetter(Reason {
                code: "too-large".into(),
                detail: format!(
                    "the payload has {} bytes; message_bytes_max is {}",
                    m.payload.len(),
                    self.message_bytes_max
                ),
            });
        }
        let headers: Vec<(&str, &str)> = m
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let message = idem_message::Message {
            payload: &m.payload,
            headers: &headers,
            message_id: m.message_id.as_deref(),
        };
        let intent = match self.intent.intent(&message) {
            Ok(intent) => intent,
            Err(reason) => return rejected(&reason),
        };
        let content_type = m
            .content_type
            .as_deref()
            .and_then(|v| HeaderValue::from_str(v).ok())
            .unwrap_or(HeaderValue::from_static(CONTENT_TYPE_DEFAULT));
        let payload = m.payload.clone();
        let outcome = self
            .run
            .run(&intent, |attempt| async move {
                let key = HeaderValue::from_str(attempt.id.key.as_str())
                    .map_err(|_| AttemptOutcome::NotSent)?;
                let headers = vec![
                    (self.key_header.clone(), key),
                    (header::CONTENT_TYPE, content_type),
                ];
                match self.endpoint.post(payload, headers, attempt.deadline).await {
                    Ok(answer) => {
                        if let Some(why) = &answer.not_stored {
                            tracing::warn!(subscription = %self.name, key = %attempt.id.key,
                                endpoint = %self.endpoint.url(), status = answer.status,
                                reason = %why, "the answer's body is not kept");
                        }
                        Ok(Reply {
                            status: answer.status,
                            headers: answer
                                .content_type
                                .map(|ct| vec![("content-type".to_owned(), ct)])
                                .unwrap_or_default(),
                            body: answer.body.to_vec(),
                            not_stored: answer.not_stored,
                        })
                    }
                    Err(failure) => {
                        tracing::warn!(subscription = %self.name, key = %attempt.id.key,
                            endpoint = %self.endpoint.url(), reason = %failure.reason,
                            "delivery failed");
                        Err(failure.outcome)
                    }
                }
            })
            .await;
        match outcome {
            Outcome::Ack { done } => {
                if let Done::Executed { result } = &done {
                    tracing::debug!(subscription = %self.name, key = %intent.id.key,
                        status = result.status(), "delivered");
                }
                Settlement::Ack
            }
            Outcome::Retry { after, reason } => {
                tracing::debug!(subscription = %self.name, key = %intent.id.key,
                    ?reason, "not final; the message comes back");
                // A lease can be long; a duplicate of a message finished in
                // milliseconds need not wait all of it.
                Settlement::Retry {
                    after: after.min(self.retry_after_max),
                }
            }
            Outcome::Reject { reason } => rejected(&reason),
            // A future outcome this version does not know: never ack it.
            _ => Settlement::Retry {
                after: self.retry_after_max,
            },
        }
    }
}

impl Handler for Subscriber {
    fn handle<'a>(
        &'a self,
        message: &'a Message,
    ) -> Pin<Box<dyn Future<Output = Settlement> + Send + 'a>> {
        Box::pin(self.settle(message))
    }
}

/// The settlement of a message that is never run.
fn rejected(reason: &RejectReason) -> Settlement {
    let reason_out = Reason {
        code: reason.code().into(),
        detail: reason.to_string(),
    };
    match reason.sink() {
        Sink::Late => Settlement::Late(reason_out),
        Sink::DeadLetter => Settlement::DeadLetter(reason_out),
    }
}
