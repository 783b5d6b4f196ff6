//! The `[admin]` section: the named operators of the admin API and the
//! console (`[[admin.operator]]`, one token each, read from the
//! environment) and the header a trusted proxy names the operator in.
//! The single `admin_token_env` token of earlier configs stays valid as
//! operator `admin`.

use std::path::{Path, PathBuf};

use http::HeaderName;
use serde::Deserialize;

use super::listeners::check_env_name;
use super::{ConfigError, FileConfig, Place};
use crate::admin::{ADMIN_OPERATOR, AdminToken, OPERATORS_MAX, OperatorName, Operators};

/// `[admin]` as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    /// Operators with a token of their own.
    #[serde(default, rename = "operator")]
    pub operators: Vec<OperatorSpec>,
    /// A header the trusted proxy in front of the admin listener sets to
    /// the name of the person it authenticated, e.g. `X-Forwarded-User`.
    pub operator_header: Option<String>,
}

/// One `[[admin.operator]]` as written.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OperatorSpec {
    /// The name every resolution of this operator is journaled under.
    pub name: String,
    /// The environment variable holding this operator's token.
    pub token_env: String,
}

/// Who may use the admin listener, validated; the tokens are read from
/// the environment when the gateway starts ([`AdminOperators::operators`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminOperators {
    /// Named operators and the variables that hold their tokens.
    pub named: Vec<(OperatorName, String)>,
    /// Whether `admin_token_env`'s token is operator `admin`: when the
    /// file names the variable, or names no other way in.
    pub single: bool,
    /// The trusted proxy's header.
    pub header: Option<HeaderName>,
    /// The config file, named in errors about the environment.
    pub file: Option<PathBuf>,
}

impl AdminOperators {
    pub(super) fn validate(file: &FileConfig, at: Place) -> Result<AdminOperators, ConfigError> {
        let section = file.admin.clone().unwrap_or_default();
        if section.operators.len() > OPERATORS_MAX {
            let reason = format!(
                "{} operators; at most {OPERATORS_MAX}",
                section.operators.len()
            );
            return Err(at.err("admin.operator", reason, true));
        }
        let mut named: Vec<(OperatorName, String)> = Vec::new();
        for (i, spec) in section.operators.iter().enumerate() {
            let field = |f: &str| format!("admin.operator[{i}].{f}");
            let name =
                OperatorName::new(&spec.name).map_err(|r| at.err(&field("name"), r, true))?;
            check_env_name(&spec.token_env).map_err(|r| at.err(&field("token_env"), r, true))?;
            if let Some(j) = named.iter().position(|(other, _)| *other == name) {
                let reason = format!("{:?} is also the name of admin.operator[{j}]", spec.name);
                return Err(at.err(&field("name"), reason, true));
            }
            if let Some(j) = named.iter().position(|(_, env)| *env == spec.token_env) {
                let reason = format!(
                    "{} is also the token_env of admin.operator[{j}]; each operator needs a token of its own",
                    spec.token_env
                );
                return Err(at.err(&field("token_env"), reason, true));
            }
            named.push((name, spec.token_env.clone()));
        }
        let header = match &section.operator_header {
            Some(raw) => Some(HeaderName::try_from(raw.trim()).map_err(|_| {
                at.err(
                    "admin.operator_header",
                    format!("{raw:?} is not a header name"),
                    true,
                )
            })?),
            None => None,
        };
        let single = file.admin_token_env.is_some() || (named.is_empty() && header.is_none());
        if single && named.iter().any(|(n, _)| n.as_str() == ADMIN_OPERATOR) {
            let reason = format!(
                "{ADMIN_OPERATOR:?} is the name of admin_token_env's operator; choose another, \
                 or remove admin_token_env"
            );
            return Err(at.err("admin.operator.name", reason, true));
        }
        Ok(AdminOperators {
            named,
            single,
            header,
            file: at.path.map(Path::to_path_buf),
        })
    }

    /// The operators with their tokens, read with `lookup` (the process
    /// environment in `idem serve`): `admin_token_env`'s as operator
    /// `admin` (see [`AdminOperators::single`]), and each named one's.
    /// Refused unless every variable is set to a valid token and no two
    /// operators share one.
    pub fn operators(
        &self,
        admin_token_env: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Operators, ConfigError> {
        let mut tokens = Vec::new();
        if self.single {
            let token = read_token("admin_token_env", admin_token_env, &lookup)
                .map_err(|e| self.placed(e))?;
            tokens.push((
                OperatorName::new(ADMIN_OPERATOR).map_err(admin_name)?,
                token,
            ));
        }
        for (i, (name, env)) in self.named.iter().enumerate() {
            let field = format!("admin.operator[{i}].token_env");
            let token = read_token(&field, env, &lookup).map_err(|e| self.placed(e))?;
            tokens.push((name.clone(), token));
        }
        Operators::new(tokens, self.header.clone())
            .map_err(|r| self.placed(ConfigError::new("admin.operator", r)))
    }

    fn placed(&self, e: ConfigError) -> ConfigError {
        match &self.file {
            Some(path) => e.in_file(path),
            None => e,
        }
    }
}

/// The token in the variable `name`, refused under `field`.
pub(super) fn read_token(
    field: &str,
    name: &str,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<AdminToken, ConfigError> {
    let err = |reason: String| ConfigError::new(field, reason);
    let Some(value) = lookup(name) else {
        return Err(err(format!(
            "the admin API is enabled but the environment variable {name} is not set \
             (or not UTF-8); set it to a random token of at least {} bytes, e.g. \
             {name}=$(openssl rand -hex 32)",
            crate::ADMIN_TOKEN_BYTES_MIN
        )));
    };
    AdminToken::new(&value).map_err(|why| err(format!("environment variable {name}: {why}")))
}

fn admin_name(reason: String) -> ConfigError {
    ConfigError::new("admin_token_env", reason)
}
