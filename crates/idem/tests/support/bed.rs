//! One upstream and `idem serve` with its admin API on a fresh store of
//! either kind, and what the operator's tests ask of it: the admin API,
//! a record as it lists it, and `idem records show`.

use std::net::SocketAddr;

use super::{Gateway, PgSchema, Reply, Site, Upstream, idem, send, text};

/// Where a bed keeps its records.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Sqlite,
    Postgres,
}

/// An upstream and a gateway with its admin API, and what keeps the
/// store.
pub struct Bed {
    pub up: Upstream,
    pub gw: Gateway,
    pub admin_addr: SocketAddr,
    /// The store's URL, for the CLI and for other processes.
    pub store: String,
    token: String,
    _site: Site,
    _schema: Option<PgSchema>,
}

impl Bed {
    /// Starts the upstream and `idem serve` on a fresh store of `kind`
    /// (`tag` names its PostgreSQL schema), with the configuration
    /// `config` (empty: the defaults) and the admin token `token`.
    pub async fn start(kind: Kind, tag: &str, config: &str, token: &str) -> Bed {
        let (up, site) = (Upstream::start().await, Site::new());
        let (store, schema) = match kind {
            Kind::Sqlite => (format!("sqlite://{}", site.store().display()), None),
            Kind::Postgres => {
                let schema = PgSchema::new(tag);
                (schema.store_url(), Some(schema))
            }
        };
        let config = (!config.is_empty()).then(|| site.config(config));
        let (gw, admin_addr) =
            Gateway::start_admin_url(&up.url(), &store, config.as_deref(), token);
        Bed {
            up,
            gw,
            admin_addr,
            store,
            token: token.to_owned(),
            _site: site,
            _schema: schema,
        }
    }

    /// A request to the admin API with the bed's token.
    pub async fn admin(&self, method: &str, path: &str, body: &str) -> Reply {
        let auth = format!("Bearer {}", self.token);
        let url = format!("http://{}{path}", self.admin_addr);
        send(method, &url, &[("authorization", &auth)], body).await
    }

    /// The record of `key` as the admin API lists it: (scope, token,
    /// state).
    pub async fn record(&self, key: &str) -> (String, u64, String) {
        let listed = self.admin("GET", "/records?limit=100", "").await;
        assert_eq!(listed.status, 200, "{listed:?}");
        let page: serde_json::Value = serde_json::from_str(&listed.body).unwrap();
        let found = page["records"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == key)
            .unwrap_or_else(|| panic!("no record for {key}: {page}"))
            .clone();
        (
            found["scope"].as_str().unwrap().to_owned(),
            found["token"].as_u64().unwrap(),
            found["state"].as_str().unwrap().to_owned(),
        )
    }

    /// `idem records show SCOPE KEY` as JSON, and as the table people
    /// read.
    pub fn show(&self, scope: &str, key: &str) -> (serde_json::Value, String) {
        let base = ["records", "show", scope, key, "--store", &self.store];
        let out = idem(&[&base[..], &["--format", "json"]].concat());
        assert!(out.status.success(), "{}", text(&out.stderr));
        let doc = serde_json::from_slice(&out.stdout).unwrap();
        let table = idem(&base);
        assert!(table.status.success(), "{}", text(&table.stderr));
        (doc, text(&table.stdout))
    }
}
