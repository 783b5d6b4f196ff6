//! Load errors that point at the file, line, column and field that is wrong.
//!
//! TOML syntax and schema errors carry a byte span; validation errors carry a
//! field path. Both are resolved against the parsed document so every error
//! names a place a person can open in an editor.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// What kind of problem stopped a contract from loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The file could not be read.
    Io,
    /// The file is not valid TOML.
    Syntax,
    /// Valid TOML that does not fit the schema: unknown field, wrong type, unknown enum value.
    Schema,
    /// Fits the schema but a value is invalid (e.g. `max_receives = 0`).
    Invalid,
}

/// A contract file that could not be loaded. Display: `FILE:LINE:COL: field: reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContractError {
    /// What kind of problem.
    pub kind: ErrorKind,
    /// The file, as given to [`crate::load`] or [`crate::parse`].
    pub file: PathBuf,
    /// 1-based line; 0 when no position is known (I/O errors).
    pub line: usize,
    /// 1-based column (in characters); 0 when unknown.
    pub column: usize,
    /// Dotted field path, e.g. `replay.queue.max_receives`; empty when unknown.
    pub field: String,
    /// What is wrong and, where it helps, what to write instead.
    pub reason: String,
}

impl fmt::Display for ContractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for ContractError {}

/// Resolves spans to fields and fields to spans within one source text.
pub(crate) struct Locator<'a> {
    file: &'a Path,
    text: &'a str,
    doc: Option<Spanned<DeTable<'a>>>,
}

impl<'a> Locator<'a> {
    pub(crate) fn new(file: &'a Path, text: &'a str) -> Self {
        let doc = DeTable::parse(text).ok();
        Locator { file, text, doc }
    }

    /// An error from the TOML parser or deserializer.
    pub(crate) fn toml_error(&self, e: &toml::de::Error) -> ContractError {
        let span = e.span().unwrap_or(0..0);
        let field = self
            .doc
            .as_ref()
            .map(|d| path_at(d.get_ref(), span.start))
            .unwrap_or_default();
        let kind = if self.doc.is_some() {
            ErrorKind::Schema
        } else {
            ErrorKind::Syntax
        };
        let reason = e.message().trim().replace('\n', " ");
        self.at(kind, span.start, field, reason)
    }

    /// A validation error for `field` (a dotted path), placed at that field's key
    /// or, when the field is absent, at the nearest enclosing table.
    pub(crate) fn invalid(&self, field: &str, reason: String) -> ContractError {
        let offset = self
            .doc
            .as_ref()
            .and_then(|d| span_of(d.get_ref(), field))
            .map(|s| s.start)
            .unwrap_or(0);
        self.at(ErrorKind::Invalid, offset, field.to_string(), reason)
    }

    fn at(&self, kind: ErrorKind, offset: usize, field: String, reason: String) -> ContractError {
        let (line, column) = line_column(self.text, offset);
        ContractError {
            kind,
            file: self.file.to_path_buf(),
            line,
            column,
            field,
            reason,
        }
    }
}

/// An I/O error reading `file`.
pub(crate) fn io_error(file: &Path, e: &std::io::Error) -> ContractError {
    ContractError {
        kind: ErrorKind::Io,
        file: file.to_path_buf(),
        line: 0,
        column: 0,
        field: String::new(),
        reason: format!("cannot read: {e}"),
    }
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// The dotted path of the key or scalar value containing `offset`. The whole
/// tree is searched because a `[header]` table's span need not cover its body.
fn path_at(table: &DeTable<'_>, offset: usize) -> String {
    let mut path = Vec::new();
    if search_table(table, offset, &mut path) {
        path.join(".")
    } else {
        String::new()
    }
}

fn search_table(table: &DeTable<'_>, offset: usize, path: &mut Vec<String>) -> bool {
    for (key, value) in table.iter() {
        path.push(key.get_ref().to_string());
        let scalar = !matches!(value.get_ref(), DeValue::Table(_) | DeValue::Array(_));
        if contains(&key.span(), offset) || (scalar && contains(&value.span(), offset)) {
            return true;
        }
        if search_value(value.get_ref(), offset, path) {
            return true;
        }
        path.pop();
    }
    false
}

fn search_value(value: &DeValue<'_>, offset: usize, path: &mut Vec<String>) -> bool {
    match value {
        DeValue::Table(t) => search_table(t, offset, path),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let Some(last) = path.last().cloned() else {
                    return false;
                };
                if let Some(slot) = path.last_mut() {
                    *slot = format!("{last}[{i}]");
                }
                let scalar = !matches!(item.get_ref(), DeValue::Table(_) | DeValue::Array(_));
                if (scalar && contains(&item.span(), offset))
                    || search_value(item.get_ref(), offset, path)
                {
                    return true;
                }
                if let Some(slot) = path.last_mut() {
                    *slot = last;
                }
            }
            false
        }
        _ => false,
    }
}

fn contains(span: &Range<usize>, offset: usize) -> bool {
    span.start <= offset && offset < span.end.max(span.start + 1)
}

/// The key span of a dotted path (`a.b[2].c`), or of its longest existing prefix.
fn span_of(table: &DeTable<'_>, field: &str) -> Option<Range<usize>> {
    let mut current = table;
    let mut found = None;
    for segment in field.split('.') {
        let (name, index) = match segment.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (segment, None),
        };
        let Some((key, value)) = current.iter().find(|(k, _)| k.get_ref() == name) else {
            break;
        };
        found = Some(key.span());
        let mut value = value.get_ref();
        if let (Some(i), DeValue::Array(items)) = (index, value) {
            let Some(item) = items.get(i) else { break };
            found = Some(item.span());
            value = item.get_ref();
        }
        match value {
            DeValue::Table(t) => current = t,
            _ => break,
        }
    }
    found
}
