//! Compiles the journal's one piece of C++: a RocksDB prefix extractor that RocksDB's C API
//! cannot set (see `cpp/key_prefix.cc` and `src/memtable_hint.rs`), against the headers of the
//! RocksDB that `librocksdb-sys` builds.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=cpp/key_prefix.cc");
    println!("cargo:rerun-if-env-changed=ROCKSDB_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=ROCKSDB_LIB_DIR");
    println!("cargo:rerun-if-env-changed=ROCKSDB_CXX_STD");
    if std::env::var_os("ROCKSDB_LIB_DIR").is_some()
        && std::env::var_os("ROCKSDB_INCLUDE_DIR").is_none()
    {
        // The extractor derives from a C++ class of RocksDB's: its headers must be those of
        // the library that is linked, not the sources that `librocksdb-sys` ships.
        println!(
            "cargo:warning=a RocksDB from ROCKSDB_LIB_DIR is linked: set ROCKSDB_INCLUDE_DIR to \
             its headers, or the journal's prefix extractor is compiled against the RocksDB \
             headers bundled with librocksdb-sys"
        );
    }
    // `librocksdb-sys` tells its direct dependents where its sources are; a RocksDB linked
    // from the system names its headers with `ROCKSDB_INCLUDE_DIR`, as for `librocksdb-sys`.
    let include = std::env::var_os("ROCKSDB_INCLUDE_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("DEP_ROCKSDB_CARGO_MANIFEST_DIR")
                .map(|dir| PathBuf::from(dir).join("rocksdb").join("include"))
        })
        .expect("RocksDB's headers: librocksdb-sys sets DEP_ROCKSDB_CARGO_MANIFEST_DIR");
    let mut build = cc::Build::new();
    // The C++ standard RocksDB is compiled with (`librocksdb-sys` reads the same variable).
    match std::env::var("ROCKSDB_CXX_STD") {
        Ok(flag) => build.flag(flag),
        Err(_) => build.std("c++20"),
    };
    build
        .cpp(true)
        .include(include)
        .file("cpp/key_prefix.cc")
        .warnings(true)
        .compile("dtask_key_prefix");
}
