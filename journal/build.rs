//! Compiles the journal's one piece of C++: a RocksDB prefix extractor that RocksDB's C API
//! cannot set (see `cpp/key_prefix.cc` and `src/memtable_hint.rs`), against the headers of the
//! RocksDB that `librocksdb-sys` builds.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=cpp/key_prefix.cc");
    println!("cargo:rerun-if-env-changed=ROCKSDB_INCLUDE_DIR");
    // `librocksdb-sys` tells its direct dependents where its sources are; a RocksDB linked
    // from the system names its headers with `ROCKSDB_INCLUDE_DIR`, as for `librocksdb-sys`.
    let include = std::env::var_os("ROCKSDB_INCLUDE_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("DEP_ROCKSDB_CARGO_MANIFEST_DIR")
                .map(|dir| PathBuf::from(dir).join("rocksdb").join("include"))
        })
        .expect("RocksDB's headers: librocksdb-sys sets DEP_ROCKSDB_CARGO_MANIFEST_DIR");
    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .include(include)
        .file("cpp/key_prefix.cc")
        .warnings(true)
        .compile("dtask_key_prefix");
}
