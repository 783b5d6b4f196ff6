//! TEMPORARY stand-in until the real fingerprint module lands.
#![allow(missing_docs)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct Fingerprint([u8; 32]);
impl Fingerprint {
    pub fn from_bytes(b: [u8; 32]) -> Self {
        Fingerprint(b)
    }
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
    pub fn from_hex(s: &str) -> Result<Self, FingerprintError> {
        let mut out = [0u8; 32];
        if s.len() != 64 {
            return Err(FingerprintError::BadHex);
        }
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(s.get(i * 2..i * 2 + 2).ok_or(FingerprintError::BadHex)?, 16)
                .map_err(|_| FingerprintError::BadHex)?;
        }
        Ok(Fingerprint(out))
    }
}
impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}
impl serde::Serialize for Fingerprint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}
impl<'de> serde::Deserialize<'de> for Fingerprint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        Fingerprint::from_hex(&s).map_err(|_| serde::de::Error::custom("bad hex"))
    }
}
#[derive(Debug)]
pub enum FingerprintError {
    BadHex,
}
pub struct RequestParts<'a> {
    pub method: &'a str,
}
pub enum Body<'a> {
    Raw(&'a [u8]),
}
