//! `idem consume` over Amazon SQS on moto in server mode (127.0.0.1:4568,
//! started by `scripts/test.sh`), black-box: the consumer suite
//! (`support/consume_suite.rs`) with SQS as the broker, each test's queue
//! and its two sink queues created as an operator would, and SQS's own
//! cases: a visibility timeout shorter than the effect, a FIFO queue's
//! groups kept in order, a queue deleted under a running consumer, and a
//! redrive from the queue's redrive-policy dead-letter queue.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failure here is a failed test

mod support;

use support::sqs::Sqs;

consume_suite!(Sqs);
