//! One DynamoDB item per (scope, key), and the table's other items.
//!
//! A record's item holds the record, the failed lookups of its ambiguous
//! attempt and its resolution journal, so that every change the contract
//! makes atomic (a verdict, its journal entry and the end of its tries) is
//! one conditional write of one item: it works on tables without
//! transactions, such as multi-Region strongly consistent global tables.
//! The item outlives its record: a release or a "not executed" verdict
//! leaves it `absent`, keeping the last token handed out (tokens increase
//! across releases) and the journal (which outlives the record).
//!
//! Every write carries `v`, the item's version, one more than the version
//! it was decided on, and `w`, a write id drawn for that one write: a write
//! whose answer was lost and that is sent again meets itself, fails its
//! condition, and is recognised by its write id.

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use idem_core::{
    DamagedRow, Fingerprint, HeaderBytes, IdempotencyKey, JOURNAL_PER_RECORD_MAX, JournalEntry,
    LookupTries, Outcome, Record, RecordId, Resolution, Resolved, Scope, State, StoredResult,
    Timestamp, Token, Verb,
};

/// The table's partition key attribute.
pub const PK: &str = "pk";
/// The sparse index of ambiguous records: partition `amb`, sort `amb_sk`.
pub const AMBIGUOUS_INDEX: &str = "ambiguous";
/// The sparse index of records the purge will change: partition
/// `due_shard`, sort `due`.
pub const DUE_INDEX: &str = "due";
/// How many partitions the due index spreads its items over, so that the
/// purge index never makes one hot partition of every completed record.
pub const DUE_SHARDS: u32 = 16;
/// The attribute DynamoDB's TTL is set on: seconds since the epoch after
/// which DynamoDB may delete the item. It only reclaims storage: every
/// decision reads the stored instants, never this.
pub const TTL_ATTRIBUTE: &str = "reclaim_after";
/// How long after its tombstone horizon (or its release) an item without a
/// journal may be reclaimed, in seconds.
pub const RECLAIM_GRACE_S: u64 = 24 * 3600;
/// The partition key of the suspect window's item.
pub const WINDOW_PK: &str = "window";
/// The partition key of the item naming the table's layout version.
pub const META_PK: &str = "meta";
/// The layout version this code writes and reads.
pub const LAYOUT_VERSION: i64 = 1;
/// The longest sort key of a global secondary index, in bytes.
const INDEX_SORT_KEY_BYTES_MAX: usize = 1024;
/// The separator of scope and key in the partition key. Scopes hold no
/// control character and keys only visible ASCII, so the key is
/// unambiguous and sorts in (scope, key) byte order.
const SEPARATOR: char = '\n';

/// One item's attributes.
pub type Attrs = HashMap<String, AttributeValue>;

/// The partition key of (scope, key).
pub fn pk_of(id: &RecordId) -> String {
    format!("{}{SEPARATOR}{}", id.scope.as_str(), id.key.as_str())
}

/// The (scope, key) text of a partition key, or `None` for the table's
/// other items.
pub fn split_pk(pk: &str) -> Option<(&str, &str)> {
    pk.split_once(SEPARATOR)
}

/// A record's item as read, or as it will be written.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// The version the item was read at; 0 when there is no item.
    pub version: u64,
    /// The write id of the write that made this version.
    pub write_id: String,
    /// The last token handed out for this (scope, key).
    pub last_token: u64,
    /// The record, `None` when there is none (never claimed, released).
    pub record: Option<Record>,
    /// The failed lookups kept for the record's ambiguous attempt.
    pub tries: Option<LookupTries>,
    /// The resolution journal, oldest first.
    pub journal: Vec<JournalEntry>,
}

impl Item {
    /// The item of a (scope, key) never written.
    pub fn missing() -> Item {
        Item {
            version: 0,
            write_id: String::new(),
            last_token: 0,
            record: None,
            tries: None,
            journal: Vec::new(),
        }
    }

    /// Appends a journal entry, dropping the oldest beyond
    /// [`JOURNAL_PER_RECORD_MAX`] entries or [`JOURNAL_BYTES_MAX`] bytes of
    /// the journal as the item keeps it (JSON, escapes included); the
    /// newest entry is always kept (its texts are bounded far below).
    pub fn append_journal(&mut self, entry: JournalEntry) {
        self.journal.push(entry);
        let over = self.journal.len().saturating_sub(JOURNAL_PER_RECORD_MAX);
        self.journal.drain(..over);
        while self.journal.len() > 1 && kept_bytes(&self.journal) > JOURNAL_BYTES_MAX {
            self.journal.remove(0);
        }
    }

    /// The attributes to write for `id`, at `version`, by the write
    /// `write_id`, and the payload chunk items to write before them (none
    /// unless the result and resolution are over [`PAYLOAD_INLINE_MAX`]).
    pub fn to_attributes(
        &self,
        id: &RecordId,
        version: u64,
        write_id: &str,
    ) -> Result<(Attrs, Vec<Attrs>), String> {
        let mut item = HashMap::new();
        let pk = pk_of(id);
        item.insert(PK.into(), s(&pk));
        item.insert("v".into(), n(version));
        item.insert("w".into(), s(write_id));
        item.insert("lt".into(), n(self.last_token));
        match &self.record {
            Some(record) => put_record(&mut item, record, &pk),
            None => {
                item.insert("st".into(), s("absent"));
            }
        }
        if let Some(tries) = &self.tries {
            item.insert("tt".into(), n(tries.token.0));
            item.insert("tf".into(), n(u64::from(tries.failures)));
            item.insert("tn".into(), n(tries.next_at.as_millis()));
        }
        if !self.journal.is_empty() {
            let kept: Vec<KeptEntry> = self.journal.iter().map(KeptEntry::from).collect();
            let json = serde_json::to_string(&kept).map_err(|e| format!("journal: {e}"))?;
            item.insert("jr".into(), s(&json));
        }
        let reclaim = self.reclaim_after();
        if let Some(at) = reclaim {
            item.insert(TTL_ATTRIBUTE.into(), n(at));
        }
        let mut chunks = Vec::new();
        if let Some(record) = &self.record
            && let Some(payload) = encode_payload(record)?
        {
            if payload.len() <= PAYLOAD_INLINE_MAX {
                item.insert("pl".into(), AttributeValue::B(Blob::new(payload)));
            } else {
                for (i, part) in payload.chunks(PAYLOAD_CHUNK_BYTES).enumerate() {
                    let mut chunk: Attrs = HashMap::from([
                        (PK.to_owned(), s(&chunk_pk(write_id, i))),
                        ("b".to_owned(), AttributeValue::B(Blob::new(part))),
                    ]);
                    if let Some(at) = record.tombstone_until {
                        chunk.insert(
                            TTL_ATTRIBUTE.into(),
                            n(at.as_millis() / 1000 + RECLAIM_GRACE_S),
                        );
                    }
                    chunks.push(chunk);
                }
                item.insert("plw".into(), s(write_id));
                item.insert("plc".into(), n(chunks.len() as u64));
            }
        }
        let journal_bytes = item.get("jr").map_or(0, |j| match j {
            AttributeValue::S(text) => text.len(),
            _ => 0,
        });
        if journal_bytes > JOURNAL_BYTES_MAX {
            return Err(format!(
                "the journal is {journal_bytes} bytes; at most {JOURNAL_BYTES_MAX} fit"
            ));
        }
        Ok((item, chunks))
    }

    /// When DynamoDB may delete the item, in epoch seconds: never while it
    /// keeps a journal or an unfinished record; a day after the tombstone
    /// horizon of a completed record; a day after the last token's instant
    /// for an item with no record (tokens carry their second, see
    /// [`next_token`]).
    fn reclaim_after(&self) -> Option<u64> {
        if !self.journal.is_empty() {
            return None;
        }
        let base_ms = match &self.record {
            Some(r) => r.tombstone_until?.as_millis(),
            None => token_millis(self.last_token),
        };
        Some(base_ms / 1000 + RECLAIM_GRACE_S)
    }
}

/// How many low bits of a token are drawn at random.
const TOKEN_RANDOM_BITS: u32 = 30;

/// The token the next attempt of a key gets: above every token the key's
/// item remembers, and at least the current second shifted left over 30
/// random bits. The second makes tokens keep increasing even after an
/// item was reclaimed by TTL (as long as clocks do not step back by more
/// than [`RECLAIM_GRACE_S`]); the random bits make two keys claimed in the
/// same second get different tokens without a shared counter (one more
/// write per claim): two equal tokens need the same second and the same
/// 30 random bits.
pub fn next_token(last_token: u64, now: Timestamp, random: u32) -> u64 {
    let random = u64::from(random) & ((1 << TOKEN_RANDOM_BITS) - 1);
    let floor = (now.as_millis() / 1000)
        .checked_shl(TOKEN_RANDOM_BITS)
        .map_or(u64::MAX, |f| f | random);
    last_token.saturating_add(1).max(floor)
}

/// The instant (milliseconds) a token of [`next_token`] carries.
fn token_millis(token: u64) -> u64 {
    (token >> TOKEN_RANDOM_BITS).saturating_mul(1000)
}

fn put_record(item: &mut HashMap<String, AttributeValue>, r: &Record, pk: &str) {
    item.insert("st".into(), s(r.state.as_str()));
    item.insert("tok".into(), n(r.token.0));
    item.insert("fp".into(), s(&r.fingerprint.to_hex()));
    item.insert("own".into(), s(&r.owner));
    if let Some(region) = &r.region {
        item.insert("reg".into(), s(region));
    }
    item.insert("lease".into(), n(r.lease_until.as_millis()));
    item.insert("cat".into(), n(r.created_at.as_millis()));
    opt_time(item, "cpl", r.completed_at);
    opt_time(item, "exp", r.expires_at);
    opt_time(item, "tsu", r.tombstone_until);
    item.insert("ret".into(), n(r.retention_s));
    item.insert("tbs".into(), n(r.tombstone_s));
    if let Some(note) = &r.ambiguity
        && let Ok(json) = serde_json::to_string(note)
    {
        // A note is plain data: serialising it cannot fail.
        item.insert("note".into(), s(&json));
    }
    if r.state == State::Ambiguous {
        item.insert("amb".into(), s("a"));
        item.insert("amb_sk".into(), s(index_sort_key(pk)));
    }
    if let Some(due) = idem_core::decision::purge_due(r) {
        item.insert("due_shard".into(), s(&due_shard(pk)));
        item.insert("due".into(), n(due.as_millis()));
    }
}

/// The ambiguous index's sort key: the partition key, cut to what an index
/// sort key may hold (a listing sorts the few long ones itself).
pub fn index_sort_key(pk: &str) -> &str {
    if pk.len() <= INDEX_SORT_KEY_BYTES_MAX {
        return pk;
    }
    let mut end = INDEX_SORT_KEY_BYTES_MAX;
    while !pk.is_char_boundary(end) {
        end -= 1;
    }
    &pk[..end]
}

/// The due index partition of a partition key: a stable hash, so the item
/// stays in one partition for its life.
pub fn due_shard(pk: &str) -> String {
    // FNV-1a: stable across versions and platforms, unlike std's hasher.
    let hash = pk.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % u64::from(DUE_SHARDS)).to_string()
}

/// Reads a record's item, and where its payload (the record's result and
/// resolution) is: [`attach`] it to the item. The error names what cannot
/// be read.
pub fn from_attributes(
    id: &RecordId,
    attrs: &HashMap<String, AttributeValue>,
) -> Result<(Item, Payload), String> {
    let record = match get_s(attrs, "st")? {
        "absent" => None,
        state => Some(read_record(id, attrs, state)?),
    };
    let tries = match attrs.get("tt") {
        None => None,
        Some(_) => Some(LookupTries {
            token: Token(get_n(attrs, "tt")?),
            failures: u32::try_from(get_n(attrs, "tf")?).map_err(|e| format!("tf: {e}"))?,
            next_at: Timestamp::from_millis(get_n(attrs, "tn")?),
        }),
    };
    let journal = match attrs.get("jr") {
        None => Vec::new(),
        Some(_) => {
            let kept: Vec<KeptEntry> =
                serde_json::from_str(get_s(attrs, "jr")?).map_err(|e| format!("journal: {e}"))?;
            kept.into_iter().map(|k| k.into_entry(id)).collect()
        }
    };
    let payload = match (attrs.get("pl"), attrs.get("plw")) {
        (Some(AttributeValue::B(b)), _) => Payload::Inline(b.as_ref().to_vec()),
        (Some(_), _) => return Err("pl is not binary".into()),
        (None, Some(_)) => Payload::Chunks {
            write_id: get_s(attrs, "plw")?.to_owned(),
            count: get_n(attrs, "plc")?,
        },
        (None, None) => Payload::None,
    };
    let item = Item {
        version: get_n(attrs, "v")?,
        write_id: get_s(attrs, "w")?.to_owned(),
        last_token: get_n(attrs, "lt")?,
        record,
        tries,
        journal,
    };
    Ok((item, payload))
}

/// Where an item's payload is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// The record has no result and no resolution.
    None,
    /// In the item.
    Inline(Vec<u8>),
    /// In `count` chunk items written by the write `write_id`
    /// ([`chunk_pk`]).
    Chunks {
        /// The write that wrote them.
        write_id: String,
        /// How many.
        count: u64,
    },
}

/// The partition key of the `index`th payload chunk of the write
/// `write_id`. It holds no newline, so it is never read as a record.
pub fn chunk_pk(write_id: &str, index: usize) -> String {
    format!("payload:{write_id}:{index}")
}

/// The largest payload kept in the record's own item, in bytes; a larger
/// one goes to chunk items written before the record's item.
pub const PAYLOAD_INLINE_MAX: usize = 300 * 1024;
/// The size of one payload chunk, in bytes.
const PAYLOAD_CHUNK_BYTES: usize = 350 * 1024;
/// The most bytes of journal text an item keeps; the oldest entries are
/// dropped beyond it (or beyond [`JOURNAL_PER_RECORD_MAX`] entries).
pub const JOURNAL_BYTES_MAX: usize = 64 * 1024;

// An item's parts fit in DynamoDB's 400 KB: the inline payload, the
// journal, and the record's other fields (scope, key, owner, region and
// numbers: under 8 KiB).
const _: () = assert!(PAYLOAD_INLINE_MAX + JOURNAL_BYTES_MAX + 8 * 1024 < 400 * 1024);

/// The payload's fields other than the body.
#[derive(serde::Serialize, serde::Deserialize)]
struct PayloadHead {
    status: Option<u16>,
    headers: Vec<(String, HeaderBytes)>,
    /// The resolution, its result left out when it is the record's own.
    resolution: Option<Resolution>,
    resolution_result_is_the_result: bool,
}

/// The record's result and resolution as bytes: a 4-byte length, the
/// head as JSON, then the body. `None` when the record has neither.
fn encode_payload(record: &Record) -> Result<Option<Vec<u8>>, String> {
    if record.result.is_none() && record.resolution.is_none() {
        return Ok(None);
    }
    let mut resolution = record.resolution.clone();
    let mut same = false;
    if let Some(Resolution {
        outcome: Outcome::Completed { result },
        ..
    }) = &mut resolution
        && Some(&*result) == record.result.as_ref()
    {
        same = true;
        *result = StoredResult::not_stored("kept as the record's result");
    }
    let head = PayloadHead {
        status: record.result.as_ref().map(StoredResult::status),
        headers: record
            .result
            .as_ref()
            .map(|r| r.headers().to_vec())
            .unwrap_or_default(),
        resolution,
        resolution_result_is_the_result: same,
    };
    let head = serde_json::to_vec(&head).map_err(|e| format!("payload: {e}"))?;
    let len = u32::try_from(head.len()).map_err(|_| "payload head too large".to_owned())?;
    let body = record.result.as_ref().map_or(&[][..], StoredResult::body);
    let mut out = Vec::with_capacity(4 + head.len() + body.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(body);
    Ok(Some(out))
}

/// Puts the payload `bytes` back into the item's record.
pub fn attach(item: &mut Item, bytes: &[u8]) -> Result<(), String> {
    let Some(record) = item.record.as_mut() else {
        return Err("a payload without a record".into());
    };
    let (len, rest) = bytes
        .split_first_chunk::<4>()
        .ok_or("the payload is cut short")?;
    let len = u32::from_be_bytes(*len) as usize;
    if rest.len() < len {
        return Err("the payload is cut short".into());
    }
    let (head, body) = rest.split_at(len);
    let head: PayloadHead = serde_json::from_slice(head).map_err(|e| format!("payload: {e}"))?;
    record.result = match head.status {
        Some(status) => Some(
            StoredResult::new(status, head.headers, body.to_vec()).map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    record.resolution = head.resolution;
    if head.resolution_result_is_the_result
        && let Some(Resolution {
            outcome: Outcome::Completed { result },
            ..
        }) = &mut record.resolution
    {
        *result = record
            .result
            .clone()
            .ok_or("the resolution's result is the record's, which has none")?;
    }
    Ok(())
}

fn read_record(
    id: &RecordId,
    attrs: &HashMap<String, AttributeValue>,
    state: &str,
) -> Result<Record, String> {
    let state: State = state.parse()?;
    let fingerprint =
        Fingerprint::from_hex(get_s(attrs, "fp")?).map_err(|e| format!("fingerprint: {e}"))?;
    Ok(Record {
        id: id.clone(),
        fingerprint,
        state,
        token: Token(get_n(attrs, "tok")?),
        owner: get_s(attrs, "own")?.to_owned(),
        region: match attrs.get("reg") {
            None => None,
            Some(_) => Some(get_s(attrs, "reg")?.to_owned()),
        },
        lease_until: Timestamp::from_millis(get_n(attrs, "lease")?),
        created_at: Timestamp::from_millis(get_n(attrs, "cat")?),
        completed_at: opt_read_time(attrs, "cpl")?,
        expires_at: opt_read_time(attrs, "exp")?,
        tombstone_until: opt_read_time(attrs, "tsu")?,
        retention_s: get_n(attrs, "ret")?,
        tombstone_s: get_n(attrs, "tbs")?,
        result: None,
        resolution: None,
        ambiguity: match attrs.get("note") {
            None => None,
            Some(_) => Some(
                serde_json::from_str(get_s(attrs, "note")?)
                    .map_err(|e| format!("ambiguity note: {e}"))?,
            ),
        },
    })
}

/// The (scope, key) of an item's partition key, or the damaged row it is.
pub fn id_of_pk(pk: &str) -> Option<Result<RecordId, DamagedRow>> {
    let (scope, key) = split_pk(pk)?;
    let damaged = |reason: String| DamagedRow {
        scope: scope.to_owned(),
        key: key.to_owned(),
        reason,
    };
    Some(
        match (Scope::new(scope), IdempotencyKey::new(key.to_owned())) {
            (Ok(scope), Ok(key)) => Ok(RecordId { scope, key }),
            (Err(e), _) => Err(damaged(format!("scope: {e}"))),
            (_, Err(e)) => Err(damaged(format!("key: {e}"))),
        },
    )
}

/// The size of the journal as an item keeps it, in bytes.
fn kept_bytes(journal: &[JournalEntry]) -> usize {
    let kept: Vec<KeptEntry> = journal.iter().map(KeptEntry::from).collect();
    serde_json::to_string(&kept).map_or(usize::MAX, |json| json.len())
}

/// A journal entry as an item keeps it (the record's id is the item's).
#[derive(serde::Serialize, serde::Deserialize)]
struct KeptEntry {
    token: u64,
    outcome: Resolved,
    status: Option<u16>,
    by: String,
    reason: String,
    at: u64,
    /// The operator's verb; absent for a resolution and in every entry
    /// kept before verbs existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    verb: Option<Verb>,
}

impl From<&JournalEntry> for KeptEntry {
    fn from(e: &JournalEntry) -> Self {
        KeptEntry {
            token: e.token.0,
            outcome: e.outcome,
            status: e.status,
            by: e.by.clone(),
            reason: e.reason.clone(),
            at: e.at.as_millis(),
            verb: e.verb,
        }
    }
}

impl KeptEntry {
    fn into_entry(self, id: &RecordId) -> JournalEntry {
        JournalEntry {
            id: id.clone(),
            token: Token(self.token),
            outcome: self.outcome,
            status: self.status,
            by: self.by,
            reason: self.reason,
            at: Timestamp::from_millis(self.at),
            verb: self.verb,
        }
    }
}

/// A string attribute.
pub fn s(text: &str) -> AttributeValue {
    AttributeValue::S(text.to_owned())
}

/// A number attribute.
pub fn n(value: u64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn opt_time(item: &mut HashMap<String, AttributeValue>, name: &str, at: Option<Timestamp>) {
    if let Some(at) = at {
        item.insert(name.into(), n(at.as_millis()));
    }
}

fn opt_read_time(
    attrs: &HashMap<String, AttributeValue>,
    name: &str,
) -> Result<Option<Timestamp>, String> {
    match attrs.get(name) {
        None => Ok(None),
        Some(_) => Ok(Some(Timestamp::from_millis(get_n(attrs, name)?))),
    }
}

/// A string attribute's text.
pub fn get_s<'a>(
    attrs: &'a HashMap<String, AttributeValue>,
    name: &str,
) -> Result<&'a str, String> {
    match attrs.get(name) {
        Some(AttributeValue::S(text)) => Ok(text),
        Some(_) => Err(format!("{name} is not a string")),
        None => Err(format!("{name} is missing")),
    }
}

/// A number attribute as an unsigned integer.
pub fn get_n(attrs: &HashMap<String, AttributeValue>, name: &str) -> Result<u64, String> {
    match attrs.get(name) {
        Some(AttributeValue::N(text)) => text
            .parse()
            .map_err(|_| format!("{name} is not an unsigned integer: {text:?}")),
        Some(_) => Err(format!("{name} is not a number")),
        None => Err(format!("{name} is missing")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u64, text: &str) -> JournalEntry {
        JournalEntry {
            id: RecordId {
                scope: Scope::new("s").unwrap_or_else(|e| panic!("{e}")),
                key: IdempotencyKey::new("k".to_owned()).unwrap_or_else(|e| panic!("{e}")),
            },
            token: Token(n),
            outcome: Resolved::NotExecuted,
            status: None,
            by: text.to_owned(),
            reason: text.to_owned(),
            at: Timestamp::from_millis(n),
            verb: None,
        }
    }

    /// Texts that JSON escapes to twice their size still leave an item
    /// within DynamoDB's 400 KB: the journal is bounded as it is kept.
    #[test]
    fn the_journal_is_bounded_as_kept_escapes_included() {
        let mut item = Item::missing();
        let text = "\"\\".repeat(2048); // 4096 bytes, 8192 escaped
        for n in 0..100 {
            item.append_journal(entry(n, &text));
        }
        let bytes = kept_bytes(&item.journal);
        assert!(bytes <= JOURNAL_BYTES_MAX, "{bytes}");
        assert!(item.journal.len() < 100 && !item.journal.is_empty());
        assert_eq!(item.journal.last().map(|e| e.token), Some(Token(99)));
        let newest_first: Vec<u64> = item.journal.iter().rev().map(|e| e.token.0).collect();
        assert!(
            newest_first.windows(2).all(|w| w[0] == w[1] + 1),
            "{newest_first:?}"
        );
    }
}
