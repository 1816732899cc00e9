//! Property tests of the export format: any event round-trips through its record line, the
//! line is what `serde_json` writes for the same JSON value (keys in lexicographic order, its
//! escaping and numbers), and a redacted line cannot be read back.
#![allow(clippy::unwrap_used)]

mod strategies;

use dtask_journal::export::{ByteFields, RecordJson, RecordLine};
use dtask_journal::{Digest, Record};
use proptest::prelude::*;
use strategies::event;

fn line(task: &str, record: &Record, bytes: ByteFields) -> String {
    let mut out = Vec::new();
    RecordJson::new(task, record, bytes)
        .write_line(&mut out)
        .unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.matches('\n').count(), 1, "one line: {text}");
    text.strip_suffix('\n').unwrap().to_owned()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_event_round_trips_through_its_line(
        event in event(),
        task in "\\PC{1,12}|[\"\\\\/\\x00-\\x1f\\x7fé😀]{1,6}",
        position in any::<u64>(),
        seq in any::<u64>(),
        digest in any::<[u8; 32]>(),
        crc in any::<u32>(),
    ) {
        let record = Record { position, seq, event, digest: Digest(digest), crc, size: 0 };
        let text = line(&task, &record, ByteFields::Base64);
        let read = RecordLine::read(&text).unwrap();
        // Every line the export writes is read the quick way.
        let quickly = RecordLine::read_quickly(&text);
        prop_assert_eq!(quickly.as_ref(), Some(&read));
        prop_assert_eq!(&read.task, &task);
        prop_assert_eq!((read.position, read.seq, read.digest, read.crc), (position, seq, Digest(digest), crc));
        prop_assert_eq!(&read.event, &record.event);
        // Written again, the same bytes; and those are serde_json's for the same value (the
        // line's envelope is written by hand, so this holds it to the `Serialize` impl).
        prop_assert_eq!(&serde_json::to_string(&read).unwrap(), &text);
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(&value.to_string(), &text);
        prop_assert_eq!(serde_json::from_value::<RecordLine>(value).unwrap(), read);

        // Redacted: valid JSON of the same shape; it reads back only if the event has no
        // byte field (then it is the same line).
        let redacted = line(&task, &record, ByteFields::Redacted);
        let serialized = serde_json::to_string(&RecordJson::new(&task, &record, ByteFields::Redacted));
        prop_assert_eq!(&serialized.unwrap(), &redacted);
        let value: serde_json::Value = serde_json::from_str(&redacted).unwrap();
        prop_assert_eq!(&value.to_string(), &redacted);
        match RecordLine::read(&redacted) {
            Ok(read) => {
                prop_assert_eq!(&redacted, &text);
                prop_assert_eq!(read.event, record.event);
            }
            Err(e) => prop_assert!(e.to_string().contains("redacted (--no-payload)"), "{}", e),
        }
    }
}
