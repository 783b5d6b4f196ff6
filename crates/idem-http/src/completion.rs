//! A route's `completion` config: the statuses it declares final, released
//! or unknown, turned into the core's completion table
//! (`idem_core::CompletionTable`), which holds the defaults and the rule
//! every caller shares.

use idem_core::{Completion, CompletionError, CompletionTable, Dedup};
use serde::Deserialize;

/// Per-route overrides, by status code.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CompletionSpec {
    /// Statuses stored and replayed.
    #[serde(rename = "final")]
    pub final_statuses: Option<Vec<u16>>,
    /// Statuses that release the key.
    pub release: Option<Vec<u16>>,
    /// Statuses whose outcome is unknown.
    pub unknown: Option<Vec<u16>>,
}

impl CompletionSpec {
    /// The route's table: the defaults plus these overrides, listed in the
    /// order final, release, unknown (the order a status listed twice is
    /// reported in).
    pub fn table(&self, dedup: Dedup) -> Result<CompletionTable, CompletionError> {
        CompletionTable::new(self.overrides(), dedup)
    }

    /// Every override as `(status, completion)`, in the order final,
    /// release, unknown: what a route built in code lists one by one.
    pub fn overrides(&self) -> Vec<(u16, Completion)> {
        let lists = [
            (&self.final_statuses, Completion::Final),
            (&self.release, Completion::Release),
            (&self.unknown, Completion::Unknown),
        ];
        lists
            .into_iter()
            .flat_map(|(list, completion)| {
                list.iter()
                    .flatten()
                    .map(move |status| (*status, completion))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config keeps its meaning: each list lands in the core table,
    /// and its mistakes are named as before.
    #[test]
    fn spec_lists_become_the_core_table() {
        let spec = CompletionSpec {
            final_statuses: Some(vec![409]),
            release: Some(vec![500]),
            unknown: Some(vec![201]),
        };
        let table = spec.table(Dedup::Idem).unwrap();
        let cases = [
            (409, Completion::Final),
            (500, Completion::Release),
            (201, Completion::Unknown),
            (502, Completion::Unknown),
            (200, Completion::Final),
        ];
        for (status, expect) in cases {
            assert_eq!(table.classify(status), expect, "{status}");
        }
        let refused = [
            (
                CompletionSpec {
                    final_statuses: Some(vec![500]),
                    release: Some(vec![500]),
                    unknown: None,
                },
                "500 is listed twice (Final and Release)",
            ),
            (
                CompletionSpec {
                    unknown: Some(vec![700]),
                    ..Default::default()
                },
                "unknown: 700 is not an HTTP status",
            ),
        ];
        for (spec, expect) in refused {
            assert_eq!(spec.table(Dedup::Idem).unwrap_err().to_string(), expect);
        }
        assert_eq!(
            CompletionSpec::default()
                .table(Dedup::Upstream)
                .unwrap()
                .classify(502),
            Completion::Release
        );
    }
}
