#include "tests/support/protobuf.h"

#include <fmt/format.h>

#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "tests/support/api_error.h"
#include "tests/support/encoding.h"

namespace geo::testapi {

namespace {

// One field of a message from k8s.io/api's generated.proto files.
struct Field {
  enum class Type { kString, kBytes, kInt, kBool, kTime, kMessage, kStringMap, kBytesMap, kRaw };
  std::string name;
  Type type;
  bool repeated = false;
  const std::map<int, Field>* message = nullptr;  // for kMessage
};
using Message = std::map<int, Field>;
using T = Field::Type;

const Message kTypeMeta = {{1, {"apiVersion", T::kString}}, {2, {"kind", T::kString}}};
const Message kOwnerReference = {
    {1, {"kind", T::kString}},     {3, {"name", T::kString}},
    {4, {"uid", T::kString}},      {5, {"apiVersion", T::kString}},
    {6, {"controller", T::kBool}}, {7, {"blockOwnerDeletion", T::kBool}}};
const Message kFieldsV1 = {{1, {"Raw", T::kRaw}}};
const Message kManagedFields = {
    {1, {"manager", T::kString}},    {2, {"operation", T::kString}},
    {3, {"apiVersion", T::kString}}, {4, {"time", T::kTime}},
    {6, {"fieldsType", T::kString}}, {7, {"fieldsV1", T::kMessage, false, &kFieldsV1}},
    {8, {"subresource", T::kString}}};
const Message kObjectMeta = {{1, {"name", T::kString}},
                             {2, {"generateName", T::kString}},
                             {3, {"namespace", T::kString}},
                             {4, {"selfLink", T::kString}},
                             {5, {"uid", T::kString}},
                             {6, {"resourceVersion", T::kString}},
                             {7, {"generation", T::kInt}},
                             {8, {"creationTimestamp", T::kTime}},
                             {9, {"deletionTimestamp", T::kTime}},
                             {10, {"deletionGracePeriodSeconds", T::kInt}},
                             {11, {"labels", T::kStringMap}},
                             {12, {"annotations", T::kStringMap}},
                             {13, {"ownerReferences", T::kMessage, true, &kOwnerReference}},
                             {14, {"finalizers", T::kString, true}},
                             {17, {"managedFields", T::kMessage, true, &kManagedFields}}};
const Message kLocalObjectReference = {{1, {"name", T::kString}}};
const Message kObjectReference = {
    {1, {"kind", T::kString}},       {2, {"namespace", T::kString}},
    {3, {"name", T::kString}},       {4, {"uid", T::kString}},
    {5, {"apiVersion", T::kString}}, {6, {"resourceVersion", T::kString}},
    {7, {"fieldPath", T::kString}}};
const Message kNamespaceSpec = {{1, {"finalizers", T::kString, true}}};
const Message kEmpty = {};
const Message kPreconditions = {{1, {"uid", T::kString}}, {2, {"resourceVersion", T::kString}}};

// Per kind: the object's top-level message. Status fields are listed as
// empty messages: the server ignores status on create and update of these.
const std::map<std::string, Message> kKinds = {
    {"Secret",
     {{1, {"metadata", T::kMessage, false, &kObjectMeta}},
      {2, {"data", T::kBytesMap}},
      {3, {"type", T::kString}},
      {4, {"stringData", T::kStringMap}},
      {5, {"immutable", T::kBool}}}},
    {"ConfigMap",
     {{1, {"metadata", T::kMessage, false, &kObjectMeta}},
      {2, {"data", T::kStringMap}},
      {3, {"binaryData", T::kBytesMap}},
      {4, {"immutable", T::kBool}}}},
    {"Namespace",
     {{1, {"metadata", T::kMessage, false, &kObjectMeta}},
      {2, {"spec", T::kMessage, false, &kNamespaceSpec}},
      {3, {"status", T::kMessage, false, &kEmpty}}}},
    {"ServiceAccount",
     {{1, {"metadata", T::kMessage, false, &kObjectMeta}},
      {2, {"secrets", T::kMessage, true, &kObjectReference}},
      {3, {"imagePullSecrets", T::kMessage, true, &kLocalObjectReference}},
      {4, {"automountServiceAccountToken", T::kBool}}}},
    {"DeleteOptions",
     {{1, {"gracePeriodSeconds", T::kInt}},
      {2, {"preconditions", T::kMessage, false, &kPreconditions}},
      {3, {"orphanDependents", T::kBool}},
      {4, {"propagationPolicy", T::kString}},
      {5, {"dryRun", T::kString, true}},
      {6, {"ignoreStoreReadErrorWithClusterBreakingPotential", T::kBool}}}},
};

class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool done() const { return pos_ >= data_.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) throw badRequest("protobuf: truncated varint");
      const uint8_t b = uint8_t(data_[pos_++]);
      v |= uint64_t(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    throw badRequest("protobuf: varint too long");
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    if (n > data_.size() - pos_) throw badRequest("protobuf: truncated field");
    std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  void skip(int wireType) {
    if (wireType == 0) {
      varint();
    } else if (wireType == 2) {
      bytes();
    } else if (wireType == 1 || wireType == 5) {
      pos_ += wireType == 1 ? 8 : 4;
    } else {
      throw badRequest(fmt::format("protobuf: unsupported wire type {}", wireType));
    }
  }

 private:
  std::string_view data_;
  size_t pos_ = 0;
};

std::string rfc3339(int64_t seconds) {
  const std::time_t t = std::time_t(seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Json decodeMessage(std::string_view data, const Message& message, const std::string& where);

Json decodeValue(Reader& r, int wireType, const Field& f, const std::string& where) {
  const bool varint = f.type == T::kInt || f.type == T::kBool;
  if (wireType != (varint ? 0 : 2)) {
    throw badRequest(
        fmt::format("protobuf: field {} of {} has wire type {}", f.name, where, wireType));
  }
  switch (f.type) {
    case T::kString: return std::string(r.bytes());
    case T::kBytes: return base64Encode(r.bytes());
    case T::kInt: return int64_t(r.varint());
    case T::kBool: return r.varint() != 0;
    case T::kTime: {
      const Json t =
          decodeMessage(r.bytes(), {{1, {"seconds", T::kInt}}, {2, {"nanos", T::kInt}}}, where);
      return rfc3339(t.value("seconds", int64_t(0)));
    }
    case T::kMessage: return decodeMessage(r.bytes(), *f.message, where + "." + f.name);
    case T::kRaw: return Json::parse(r.bytes());
    case T::kStringMap:
    case T::kBytesMap: {
      const Json entry =
          decodeMessage(r.bytes(),
                        {{1, {"key", T::kString}},
                         {2, {"value", f.type == T::kBytesMap ? T::kBytes : T::kString}}},
                        where);
      return entry;
    }
  }
  return Json();
}

Json decodeMessage(std::string_view data, const Message& message, const std::string& where) {
  Json out = Json::object();
  Reader r(data);
  while (!r.done()) {
    const uint64_t tag = r.varint();
    const int number = int(tag >> 3);
    const int wireType = int(tag & 7);
    auto it = message.find(number);
    if (it == message.end()) {
      if (&message == &kEmpty) {
        r.skip(wireType);
        continue;
      }
      throw ApiError(415, "UnsupportedMediaType",
                     fmt::format("the test apiserver does not decode protobuf field {} of {}; "
                                 "send application/json",
                                 number, where));
    }
    const Field& f = it->second;
    Json v = decodeValue(r, wireType, f, where);
    if (f.type == T::kStringMap || f.type == T::kBytesMap) {
      if (!out.contains(f.name)) out[f.name] = Json::object();
      out[f.name][v.value("key", "")] = v.value("value", "");
    } else if (f.name == "fieldsV1") {
      out[f.name] = v.value("Raw", Json::object());
    } else if (f.repeated) {
      out[f.name].push_back(std::move(v));
    } else {
      out[f.name] = std::move(v);
    }
  }
  return out;
}

}  // namespace

Json decodeKubernetesProtobuf(std::string_view body) {
  static constexpr std::string_view kMagic("k8s\0", 4);
  if (!body.starts_with(kMagic)) throw badRequest("protobuf: missing the k8s magic prefix");
  Reader r(body.substr(kMagic.size()));
  Json typeMeta;
  std::string_view raw;
  while (!r.done()) {
    const uint64_t tag = r.varint();
    const int number = int(tag >> 3);
    if (number == 1) {
      typeMeta = decodeMessage(r.bytes(), kTypeMeta, "TypeMeta");
    } else if (number == 2) {
      raw = r.bytes();
    } else {
      r.skip(int(tag & 7));
    }
  }
  const std::string kind = typeMeta.value("kind", "");
  auto it = kKinds.find(kind);
  if (it == kKinds.end()) {
    throw ApiError(415, "UnsupportedMediaType",
                   fmt::format("the test apiserver decodes protobuf only for Namespace, "
                               "ConfigMap, Secret, ServiceAccount and DeleteOptions, not {}; send "
                               "application/json",
                               kind));
  }
  Json object = decodeMessage(raw, it->second, kind);
  object.erase("status");
  object["apiVersion"] = typeMeta.value("apiVersion", "");
  object["kind"] = kind;
  return object;
}

}  // namespace geo::testapi
