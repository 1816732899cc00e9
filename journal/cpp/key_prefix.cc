// A RocksDB prefix extractor that RocksDB's C API cannot express, registered by name so that an
// options string can name it.
//
// The extractor maps a key to the key without its last `tail` bytes, for keys whose byte
// before those is `separator` (which the prefix keeps); other keys are outside its domain.
// The journal names it as the `events` space's memtable insertion hint extractor: every key
// of one task then shares one hint, the position of the task's last insert, and the next
// record of the task is inserted from there instead of from the top of the skip list. The
// key layout itself is the journal's (`journal/src/keys.rs`), which passes the widths in.

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "rocksdb/convenience.h"
#include "rocksdb/slice.h"
#include "rocksdb/slice_transform.h"
#include "rocksdb/utilities/object_registry.h"

namespace {

class TaskPrefix final : public rocksdb::SliceTransform {
 public:
  TaskPrefix(std::size_t tail, unsigned char separator)
      : tail_(tail), separator_(separator) {}

  static const char* kClassName() { return "dtask.TaskPrefix"; }
  const char* Name() const override { return kClassName(); }

  // RocksDB asks only for keys in the domain; any other key maps to itself.
  rocksdb::Slice Transform(const rocksdb::Slice& key) const override {
    return InDomain(key) ? rocksdb::Slice(key.data(), key.size() - tail_) : key;
  }

  bool InDomain(const rocksdb::Slice& key) const override {
    return key.size() > tail_ &&
           static_cast<unsigned char>(key[key.size() - tail_ - 1]) == separator_;
  }

 private:
  std::size_t tail_;
  unsigned char separator_;
};

std::once_flag registered;

}  // namespace

// Registers the extractor under `dtask.TaskPrefix` in RocksDB's default object library. Only
// the first call registers; later calls (with the same widths, as the journal makes them) do
// nothing. Returns the name to put in an options string.
extern "C" const char* dtask_register_task_prefix(std::size_t tail,
                                                  unsigned char separator) {
  std::call_once(registered, [tail, separator] {
    rocksdb::ObjectLibrary::Default()->AddFactory<const rocksdb::SliceTransform>(
        TaskPrefix::kClassName(),
        [tail, separator](const std::string& /*uri*/,
                          std::unique_ptr<const rocksdb::SliceTransform>* guard,
                          std::string* /*errmsg*/) {
          guard->reset(new TaskPrefix(tail, separator));
          return guard->get();
        });
  });
  return TaskPrefix::kClassName();
}

// For the journal's tests: looks the extractor up by name, as an options string does, and
// applies it to `key`. Returns false when the lookup fails or the key is outside the domain;
// otherwise stores the prefix's length (the prefix is always the key's start).
extern "C" bool dtask_task_prefix_of(const char* key, std::size_t len,
                                     std::size_t* prefix_len) {
  std::shared_ptr<const rocksdb::SliceTransform> transform;
  rocksdb::ConfigOptions options;
  if (!rocksdb::SliceTransform::CreateFromString(options, TaskPrefix::kClassName(), &transform)
           .ok() ||
      transform == nullptr) {
    return false;
  }
  rocksdb::Slice slice(key, len);
  if (!transform->InDomain(slice)) {
    return false;
  }
  rocksdb::Slice prefix = transform->Transform(slice);
  if (prefix.data() != key) {
    return false;
  }
  *prefix_len = prefix.size();
  return true;
}
