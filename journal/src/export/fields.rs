//! The export's field codecs, both ways: CRCs and chain digests as lower-case hex, byte
//! fields as strict base64 (or a redaction's length when written).

use super::ByteFields;
use crate::record::Digest;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::{Deserializer, Serialize, Serializer};
use serde_with::{DeserializeAs, SerializeAs};
use std::fmt;

/// nothing else.
pub(super) struct CrcHex;

impl SerializeAs<u32> for CrcHex {
    fn serialize_as<S: Serializer>(crc: &u32, serializer: S) -> Result<S::Ok, S::Error> {
        // On the stack and in one piece: `collect_str` would escape the formatter's output
        // fragment by fragment, once per record.
        let mut hex = [0u8; 8];
        for (pair, byte) in hex.chunks_exact_mut(2).zip(crc.to_be_bytes()) {
            pair.copy_from_slice(&b16(byte));
        }
        serializer.serialize_str(std::str::from_utf8(&hex).map_err(serde::ser::Error::custom)?)
    }
}

/// The two lower-case hex digits of `b`.
pub(super) fn b16(b: u8) -> [u8; 2] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0xf)]]
}

impl<'de> DeserializeAs<'de, u32> for CrcHex {
    fn deserialize_as<D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
        read_str(deserializer, "8 lower-case hex digits", |text| {
            let mut crc = [0u8; 4];
            lower_hex(text, &mut crc).then(|| u32::from_be_bytes(crc))
        })
    }
}

/// Reads a string with `read` (`None`: a value that is not `expecting`), in place where the
/// input allows it: no copy of the string is made.
fn read_str<'de, D: Deserializer<'de>, T>(
    deserializer: D,
    expecting: &'static str,
    read: fn(&str) -> Option<T>,
) -> Result<T, D::Error> {
    /// The visitor of [`read_str`].
    struct ReadStr<T> {
        expecting: &'static str,
        read: fn(&str) -> Option<T>,
    }
    impl<T> Visitor<'_> for ReadStr<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.expecting)
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
            (self.read)(text).ok_or_else(|| E::invalid_value(de::Unexpected::Str(text), &self))
        }
    }
    deserializer.deserialize_str(ReadStr { expecting, read })
}

/// A chain digest as 64 lower-case hex digits ([`Digest::to_hex`]); reading takes nothing else.
pub(super) struct DigestHex;

impl SerializeAs<Digest> for DigestHex {
    fn serialize_as<S: Serializer>(digest: &Digest, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(digest.as_hash().to_hex().as_str())
    }
}

impl<'de> DeserializeAs<'de, Digest> for DigestHex {
    fn deserialize_as<D: Deserializer<'de>>(deserializer: D) -> Result<Digest, D::Error> {
        read_str(deserializer, "64 lower-case hex digits", |text| {
            let mut digest = Digest::default();
            lower_hex(text, &mut digest.0).then_some(digest)
        })
    }
}

/// A chain digest's bytes (a purge tombstone's `last_digest`), written as [`DigestHex`]
/// writes a digest.
impl SerializeAs<[u8; 32]> for DigestHex {
    fn serialize_as<S: Serializer>(bytes: &[u8; 32], serializer: S) -> Result<S::Ok, S::Error> {
        <Self as SerializeAs<Digest>>::serialize_as(&Digest(*bytes), serializer)
    }
}

impl<'de> DeserializeAs<'de, [u8; 32]> for DigestHex {
    fn deserialize_as<D: Deserializer<'de>>(deserializer: D) -> Result<[u8; 32], D::Error> {
        <Self as DeserializeAs<'de, Digest>>::deserialize_as(deserializer).map(|d| d.0)
    }
}

/// Each byte's value as a lower-case hex digit, or `NOT_HEX`.
const LOWER_HEX: [u8; 256] = {
    let mut table = [NOT_HEX; 256];
    let mut digit = 0;
    while digit < 16 {
        let at = if digit < 10 {
            b'0' + digit
        } else {
            b'a' + digit - 10
        };
        table[at as usize] = digit;
        digit += 1;
    }
    table
};

/// What [`LOWER_HEX`] gives a byte that is not a lower-case hex digit (a digit's value has no
/// bit of it).
const NOT_HEX: u8 = 0xf0;

/// Reads `text`, exactly two lower-case hex digits a byte, into `out`; false (and `out`
/// unspecified) for any other text. A table lookup a digit and no branch on its value: the
/// digest and CRC of every line of an import go through it.
pub(super) fn lower_hex(text: &str, out: &mut [u8]) -> bool {
    if text.len() != 2 * out.len() {
        return false;
    }
    let mut seen = 0;
    for (byte, pair) in out.iter_mut().zip(text.as_bytes().chunks_exact(2)) {
        let [high, low] = pair else {
            return false;
        };
        let (high, low) = (LOWER_HEX[usize::from(*high)], LOWER_HEX[usize::from(*low)]);
        seen |= high | low;
        *byte = (high << 4) | low;
    }
    seen & NOT_HEX == 0
}

thread_local! {
    /// The base64 text of the byte field being written.
    static BASE64_BUFFER: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// A byte field to write: base64, or its length only.
#[derive(Clone, Copy)]
pub(super) struct ByteField<'a> {
    pub(super) data: &'a [u8],
    pub(super) how: ByteFields,
}

/// What a redacted byte field holds.
#[derive(Serialize)]
struct Redaction {
    redacted_len: u64,
}

impl Serialize for ByteField<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.how {
            // Encoded into a buffer kept per thread: an export writes millions of byte
            // fields, and would otherwise allocate a `String` for each.
            ByteFields::Base64 => BASE64_BUFFER.with_borrow_mut(|text| {
                text.clear();
                STANDARD.encode_string(self.data, text);
                serializer.serialize_str(text)
            }),
            ByteFields::Redacted => Redaction {
                redacted_len: self.data.len() as u64,
            }
            .serialize(serializer),
        }
    }
}

/// Reads a byte field: standard base64 with canonical padding. A redaction
/// (`{"redacted_len": N}`) is refused: its bytes are gone.
pub(super) struct StrictBase64;

impl<'de> DeserializeAs<'de, Vec<u8>> for StrictBase64 {
    fn deserialize_as<D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        deserializer.deserialize_any(StrictBase64)
    }
}

impl<'de> Visitor<'de> for StrictBase64 {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("base64 text")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Vec<u8>, E> {
        STANDARD
            .decode(text)
            .map_err(|e| E::custom(format_args!("bad base64: {e}")))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<u8>, A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'_, str>>()? {
            if key == "redacted_len" {
                return Err(de::Error::custom(
                    "the field was redacted (--no-payload): a redacted export cannot be read back",
                ));
            }
            map.next_value::<IgnoredAny>()?;
        }
        Err(de::Error::invalid_type(de::Unexpected::Map, &self))
    }
}
