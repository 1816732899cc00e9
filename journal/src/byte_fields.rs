//! Serde helpers for the events' byte fields (`#[serde(with = ...)]`).
//!
//! Byte fields are serialized as serde *bytes* rather than sequences of `u8`. The encoding is
//! the same in bincode (a length, then the raw bytes: format v1 is unchanged, as the tests
//! below and the golden fixture hold) and in JSON (an array of numbers), but the decoder
//! copies the bytes in one go, borrowing them from the record, instead of visiting them one
//! by one.

/// `Vec<u8>` fields.
pub(crate) mod bytes {
    use serde::de::{Deserializer, Error, SeqAccess, Visitor};
    use serde::Serializer;
    use std::fmt;

    pub(crate) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<u8>, D::Error> {
        deserializer.deserialize_bytes(BytesVisitor)
    }

    struct BytesVisitor;

    impl<'de> Visitor<'de> for BytesVisitor {
        type Value = Vec<u8>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("bytes")
        }

        fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }

        fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
            while let Some(byte) = seq.next_element()? {
                out.push(byte);
            }
            Ok(out)
        }
    }
}

/// [`bytes`] for an optional field.
pub(crate) mod opt_bytes {
    use serde::de::{Deserializer, Error, Visitor};
    use serde::{Serialize, Serializer};
    use std::fmt;

    #[allow(clippy::ref_option, reason = "the signature serde's `with` requires")]
    pub(crate) fn serialize<S: Serializer>(
        bytes: &Option<Vec<u8>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(bytes) => serializer.serialize_some(&Bytes(bytes)),
            None => serializer.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        deserializer.deserialize_option(OptionVisitor)
    }

    struct Bytes<'a>(&'a [u8]);

    impl Serialize for Bytes<'_> {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.serialize_bytes(self.0)
        }
    }

    struct OptionVisitor;

    impl<'de> Visitor<'de> for OptionVisitor {
        type Value = Option<Vec<u8>>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("optional bytes")
        }

        fn visit_none<E: Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(
            self,
            deserializer: D,
        ) -> Result<Self::Value, D::Error> {
            super::bytes::deserialize(deserializer).map(Some)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;
    use serde::{Deserialize, Serialize};

    /// Byte fields through the helpers.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct AsBytes {
        #[serde(with = "super::bytes")]
        data: Vec<u8>,
        #[serde(with = "super::opt_bytes")]
        snapshot: Option<Vec<u8>>,
    }

    /// The same fields as plain sequences of `u8`: how format v1 was first written.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct AsSeq {
        data: Vec<u8>,
        snapshot: Option<Vec<u8>>,
    }

    proptest! {
        #[test]
        fn bytes_and_sequences_encode_alike(data in proptest::collection::vec(any::<u8>(), 0..300), snapshot in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300))) {
            let config = bincode::config::standard();
            let bytes = AsBytes { data: data.clone(), snapshot: snapshot.clone() };
            let seq = AsSeq { data, snapshot };
            let encoded = bincode::serde::encode_to_vec(&bytes, config).unwrap();
            prop_assert_eq!(&encoded, &bincode::serde::encode_to_vec(&seq, config).unwrap());
            let (decoded, _): (AsBytes, usize) = bincode::serde::decode_from_slice(&encoded, config).unwrap();
            prop_assert_eq!(&decoded, &bytes);
            // JSON: the same arrays of numbers, read back either way.
            let json = serde_json::to_string(&bytes).unwrap();
            prop_assert_eq!(&json, &serde_json::to_string(&seq).unwrap());
            prop_assert_eq!(serde_json::from_str::<AsBytes>(&json).unwrap(), bytes);
        }
    }
}
