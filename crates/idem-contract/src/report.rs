//! The review's result: a verdict per question with why and what to change,
//! the replay horizon, and renderings for people (text) and machines (JSON).

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::horizon::{Horizon, format_duration};

/// A question's or a cross-check's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The contract answers the question safely.
    Pass,
    /// The answer allows a duplicate or lost effect.
    Fail,
    /// The contract does not answer; an assumption is an unfinished guarantee, so this fails too.
    Unanswered,
}

impl Verdict {
    /// `PASS`, `FAIL` or `UNANSWERED`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Unanswered => "UNANSWERED",
        }
    }

    /// Only PASS passes.
    pub fn passed(self) -> bool {
        self == Verdict::Pass
    }
}

/// The twelve review questions, in review order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Question {
    /// Does the key name one business intent?
    Intent,
    /// Is the key made once, where the intent is stable, and kept across retries?
    Generation,
    /// Does every dependency that performs the effect receive the key?
    Propagation,
    /// Does the fingerprint cover every input that changes the effect?
    Fingerprint,
    /// What does a second attempt see while the first is in flight?
    Concurrency,
    /// Is the result stored and replayed?
    Completion,
    /// How is an unknown outcome resolved?
    Ambiguity,
    /// Do retention, tombstones and downstream dedup windows cover the replay horizon?
    Retention,
    /// Is the key checked where every attempt can see it?
    Scope,
    /// Can two regions both accept the first claim?
    Failover,
    /// Does a restore bring records and business data back together?
    Recovery,
    /// Do tests exercise the failure cases this contract depends on?
    Testing,
}

impl Question {
    /// All twelve, in review order.
    pub const ALL: [Question; 12] = [
        Question::Intent,
        Question::Generation,
        Question::Propagation,
        Question::Fingerprint,
        Question::Concurrency,
        Question::Completion,
        Question::Ambiguity,
        Question::Retention,
        Question::Scope,
        Question::Failover,
        Question::Recovery,
        Question::Testing,
    ];

    /// Lower-case name, as shown in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Question::Intent => "intent",
            Question::Generation => "generation",
            Question::Propagation => "propagation",
            Question::Fingerprint => "fingerprint",
            Question::Concurrency => "concurrency",
            Question::Completion => "completion",
            Question::Ambiguity => "ambiguity",
            Question::Retention => "retention",
            Question::Scope => "scope",
            Question::Failover => "failover",
            Question::Recovery => "recovery",
            Question::Testing => "testing",
        }
    }
}

/// One judged item: a review question or a gateway cross-check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// What was judged: a question name (`"retention"`) or a cross-check name (`"gateway.lease"`).
    pub topic: String,
    /// The outcome.
    pub verdict: Verdict,
    /// One line: why this verdict (for PASS, the trade-off where one exists).
    pub why: String,
    /// One line: what to change; present unless the verdict is PASS.
    pub change: Option<String>,
}

impl Finding {
    pub(crate) fn pass(topic: &str, why: impl Into<String>) -> Self {
        Finding {
            topic: topic.to_string(),
            verdict: Verdict::Pass,
            why: why.into(),
            change: None,
        }
    }

    pub(crate) fn fail(topic: &str, why: impl Into<String>, change: impl Into<String>) -> Self {
        Finding {
            topic: topic.to_string(),
            verdict: Verdict::Fail,
            why: why.into(),
            change: Some(change.into()),
        }
    }

    pub(crate) fn unanswered(
        topic: &str,
        why: impl Into<String>,
        change: impl Into<String>,
    ) -> Self {
        Finding {
            verdict: Verdict::Unanswered,
            ..Finding::fail(topic, why, change)
        }
    }

    /// The finding as a JSON object: `topic`, `verdict`, `why`, `change` (null on PASS).
    pub fn to_json(&self) -> Value {
        json!({
            "topic": self.topic,
            "verdict": self.verdict.as_str(),
            "why": self.why,
            "change": self.change,
        })
    }
}

/// The result of [`crate::check`]: twelve findings and the replay horizon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// `[operation].name` of the contract.
    pub operation: String,
    /// One finding per question, in [`Question::ALL`] order.
    pub findings: Vec<Finding>,
    /// The replay horizon, or `None` when replay sources are missing.
    pub horizon: Option<Horizon>,
}

impl Report {
    /// True when every question passed.
    pub fn passed(&self) -> bool {
        self.findings.iter().all(|f| f.verdict.passed())
    }

    /// The finding for one question.
    pub fn finding(&self, question: Question) -> Option<&Finding> {
        self.findings.iter().find(|f| f.topic == question.as_str())
    }

    /// Aligned text for people; ANSI colour on verdicts when `colour` is true.
    pub fn render_text(&self, colour: bool) -> String {
        let mut out = format!("contract: {}\n\n", self.operation);
        out.push_str(&render_findings(&self.findings, colour));
        out.push('\n');
        match &self.horizon {
            Some(h) => out.push_str(&render_horizon(h)),
            None => out.push_str("replay horizon: unknown (replay sources missing)\n"),
        }
        let count = |v: Verdict| self.findings.iter().filter(|f| f.verdict == v).count();
        let _ = writeln!(
            out,
            "\n{}: {} pass, {} fail, {} unanswered",
            if self.passed() { "passed" } else { "failed" },
            count(Verdict::Pass),
            count(Verdict::Fail),
            count(Verdict::Unanswered),
        );
        out
    }

    /// The report as JSON: `operation`, `passed`, `findings[]`, `horizon` (`total_s`, `breakdown[]`) or null.
    pub fn to_json(&self) -> Value {
        let horizon = self.horizon.as_ref().map(|h| {
            json!({
                "total_s": h.total_s,
                "breakdown": h.breakdown.iter()
                    .map(|(label, s)| json!({ "component": label, "seconds": s }))
                    .collect::<Vec<_>>(),
            })
        });
        json!({
            "operation": self.operation,
            "passed": self.passed(),
            "findings": self.findings.iter().map(Finding::to_json).collect::<Vec<_>>(),
            "horizon": horizon,
        })
    }
}

/// Findings as aligned lines: topic, verdict, why; `change:` on the next line.
pub fn render_findings(findings: &[Finding], colour: bool) -> String {
    let width = findings.iter().map(|f| f.topic.len()).max().unwrap_or(0);
    let indent = " ".repeat(2 + width + 2 + 10 + 2);
    let mut out = String::new();
    for f in findings {
        let verdict = format!("{:<10}", f.verdict.as_str());
        let verdict = if colour {
            paint(f.verdict, &verdict)
        } else {
            verdict
        };
        let _ = writeln!(out, "  {:<width$}  {verdict}  {}", f.topic, f.why);
        if let Some(change) = &f.change {
            let _ = writeln!(out, "{indent}change: {change}");
        }
    }
    out
}

fn render_horizon(h: &Horizon) -> String {
    let mut out = format!(
        "replay horizon: {} ({} s)\n",
        format_duration(h.total_s),
        h.total_s
    );
    let width = h.breakdown.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    for (label, s) in &h.breakdown {
        let _ = writeln!(
            out,
            "  + {label:<width$}  {s:>9} s  {}",
            format_duration(*s)
        );
    }
    out
}

fn paint(v: Verdict, text: &str) -> String {
    let code = match v {
        Verdict::Pass => "32",
        Verdict::Fail => "31;1",
        Verdict::Unanswered => "33;1",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}
