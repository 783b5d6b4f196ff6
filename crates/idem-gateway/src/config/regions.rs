//! The regions' section: this gateway's `region` and its `[peers]`.

use std::collections::BTreeMap;

use super::{FileConfig, parse_upstream};
use crate::regions::{Regions, check_region};

/// The file's `region` and `[peers]`, validated: names by
/// [`check_region`], URLs http:// with a host, no peer named after this
/// gateway's own region.
pub(super) fn validate(file: &FileConfig) -> Result<Regions, (String, String)> {
    if let Some(region) = &file.region {
        check_region(region).map_err(|r| ("region".to_owned(), r))?;
    }
    if file.peers.len() > crate::regions::PEERS_MAX {
        let reason = format!(
            "{} peers; at most {}",
            file.peers.len(),
            crate::regions::PEERS_MAX
        );
        return Err(("peers".into(), reason));
    }
    let mut peers = BTreeMap::new();
    for (name, url) in &file.peers {
        let field = format!("peers.{name}");
        check_region(name).map_err(|r| (field.clone(), r))?;
        if file.region.as_deref() == Some(name.as_str()) {
            return Err((
                field,
                "is this gateway's own region; a peer is another region".into(),
            ));
        }
        if file.region.is_none() {
            return Err((
                field,
                "peers need this gateway's region: set region = \"...\"".into(),
            ));
        }
        let uri =
            parse_upstream(url).map_err(|r| (field.clone(), r.replace("upstream", "peer")))?;
        peers.insert(name.clone(), uri);
    }
    Ok(Regions {
        region: file.region.clone(),
        peers,
        tls: None,
    })
}
