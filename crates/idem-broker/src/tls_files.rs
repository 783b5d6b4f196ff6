//! The TLS files a broker section names, checked in one place for every
//! broker. Each section still declares `ca_file`, `cert_file` and
//! `key_file` itself: a section is read with unknown fields refused by
//! name, and serde cannot flatten a shared struct into such a section
//! (its `flatten` is documented as unsupported with
//! `deny_unknown_fields`), so the fields are spelled per section and the
//! rules about them live here.

use std::path::{Path, PathBuf};

use idem_core::FieldError;

/// A section's TLS files, as written (after [`TlsFiles::relative_to`]'s
/// placing, when read from a config file).
#[derive(Clone, Copy, Debug)]
pub struct TlsFiles<'a> {
    /// PEM CA certificates the server's certificate may chain to.
    pub ca_file: Option<&'a Path>,
    /// PEM client certificate, for a server that verifies its clients.
    pub cert_file: Option<&'a Path>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<&'a Path>,
}

impl<'a> TlsFiles<'a> {
    /// The three files of a section.
    pub fn new(
        ca_file: &'a Option<PathBuf>,
        cert_file: &'a Option<PathBuf>,
        key_file: &'a Option<PathBuf>,
    ) -> TlsFiles<'a> {
        TlsFiles {
            ca_file: ca_file.as_deref(),
            cert_file: cert_file.as_deref(),
            key_file: key_file.as_deref(),
        }
    }

    /// Each file with the field that names it, in the order a refusal
    /// names the first.
    pub fn fields(&self) -> [(&'static str, Option<&'a Path>); 3] {
        [
            ("ca_file", self.ca_file),
            ("cert_file", self.cert_file),
            ("key_file", self.key_file),
        ]
    }

    /// The first field that names a file, if any.
    pub fn first_named(&self) -> Option<&'static str> {
        self.fields()
            .into_iter()
            .find_map(|(field, file)| file.map(|_| field))
    }

    /// The client certificate and its key, or neither: one without the
    /// other is refused by the field that is missing.
    pub fn identity(&self) -> Result<Option<(&'a Path, &'a Path)>, FieldError> {
        match (self.cert_file, self.key_file) {
            (Some(_), None) => Err(FieldError::new("key_file", "is required with cert_file")),
            (None, Some(_)) => Err(FieldError::new("cert_file", "is required with key_file")),
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => Ok(Some((cert, key))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_goes_with_its_key() {
        let (cert, key) = (Some(PathBuf::from("c.pem")), Some(PathBuf::from("k.pem")));
        let cases = [
            (None, None, Ok(false)),
            (cert.clone(), key.clone(), Ok(true)),
            (cert.clone(), None, Err("key_file")),
            (None, key.clone(), Err("cert_file")),
        ];
        for (cert, key, expected) in cases {
            let files = TlsFiles::new(&None, &cert, &key);
            let got = files
                .identity()
                .map(|pair| pair.is_some())
                .map_err(|e| e.field.clone());
            assert_eq!(got, expected.map_err(str::to_owned), "{cert:?} {key:?}");
        }
    }

    #[test]
    fn the_first_named_file_is_the_one_a_refusal_names() {
        let named = Some(PathBuf::from("x.pem"));
        assert_eq!(TlsFiles::new(&None, &None, &None).first_named(), None);
        assert_eq!(
            TlsFiles::new(&None, &named, &named).first_named(),
            Some("cert_file")
        );
        assert_eq!(
            TlsFiles::new(&named, &None, &named).first_named(),
            Some("ca_file")
        );
    }
}
