//! Replay horizon arithmetic: stages of one path add, re-entries take the max.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;

use idem_contract::{format_duration, parse, replay_horizon};

const OFF: &str = "[replay.partner]\nenabled = false\n[replay.batch]\nenabled = false\n[replay.failover]\nenabled = false\n";

fn horizon(replay: &str) -> Result<(u64, Vec<u64>), Vec<String>> {
    let text = format!("[operation]\nname = \"op\"\n{replay}");
    let c = parse(&text, Path::new("h.toml")).unwrap();
    replay_horizon(c.replay.as_ref())
        .map(|h| (h.total_s, h.breakdown.iter().map(|(_, s)| *s).collect()))
}

#[test]
fn arithmetic() {
    let client = "[replay.client]\nattempts = 3\ntimeout_ms = 1500\nbackoff_max_ms = 1000\n";
    let no_queue = "[replay.queue]\nenabled = false\n";
    let queue = "[replay.queue]\nvisibility_timeout_s = 30\nmax_receives = 4\n[replay.backlog]\nrecovery_max_s = 600\n";
    let cases: Vec<(String, u64, Vec<u64>)> = vec![
        // 3 x (1.5 s + 1 s) = 7.5 s, rounded up
        (format!("{client}{no_queue}{OFF}"), 8, vec![8]),
        // client, backlog, 4 x 30 s; no DLQ
        (
            format!("{client}{queue}[replay.dlq]\nenabled = false\n{OFF}"),
            728,
            vec![8, 600, 120],
        ),
        // manual redrive: the whole DLQ retention, then the redriven message's own redelivery
        (
            format!(
                "{client}{queue}[replay.dlq]\nretention_s = 50400\nredrive = \"manual\"\n{OFF}"
            ),
            51248,
            vec![8, 600, 120, 50400, 120],
        ),
        // automatic redrive after 1 h
        (
            format!(
                "{client}{queue}[replay.dlq]\nretention_s = 50400\nredrive = \"automatic\"\nredrive_after_s = 3600\n{OFF}"
            ),
            4448,
            vec![8, 600, 120, 3600, 120],
        ),
        // never redriven: the DLQ adds nothing
        (
            format!("{client}{queue}[replay.dlq]\nretention_s = 50400\nredrive = \"never\"\n{OFF}"),
            728,
            vec![8, 600, 120],
        ),
        // re-entries: the later of partner (7 d) and batch (2 d), plus failover
        (
            format!(
                "[replay.client]\nenabled = false\n{no_queue}[replay.partner]\nresubmission_window_s = 604800\n[replay.batch]\nreprocessing_window_s = 172800\n[replay.failover]\ncatch_up_s = 900\n"
            ),
            605700,
            vec![604800, 900],
        ),
    ];
    for (replay, total, parts) in cases {
        assert_eq!(horizon(&replay), Ok((total, parts)), "{replay}");
    }
}

#[test]
fn missing_sources_are_named() {
    let got = horizon(
        "[replay.queue]\nvisibility_timeout_s = 30\nmax_receives = 1\n[replay.partner]\nenabled = false\n",
    );
    let want: Vec<String> = [
        "replay.client",
        "replay.dlq",
        "replay.backlog",
        "replay.batch",
        "replay.failover",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(got, Err(want));
    assert_eq!(horizon(""), Err(vec!["replay".to_string()]));
}

#[test]
fn durations_read_like_people_write_them() {
    for (s, text) in [
        (0, "0 s"),
        (59, "59 s"),
        (3600, "1 h"),
        (369_850, "4 d 6 h 44 min 10 s"),
    ] {
        assert_eq!(format_duration(s), text);
    }
}
