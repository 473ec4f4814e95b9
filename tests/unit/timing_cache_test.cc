// The timing cache's file: created on first save, read back by a later process, merged with what
// other processes saved meanwhile, one section per device key; files that are not timing caches
// are errors naming them and are left as they were.
#include "kiln/engine/timing_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "kiln/base/file.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class TimingCacheFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / fmt::format("kiln_timing_{}_{}", info->name(), ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  json fileJson(const fs::path& path) { return json::parse(kiln::readFileBytes(path).value()); }

  fs::path dir_;
};

TEST_F(TimingCacheFile, SavesOnlyWhatWasAddedAndReadsItBack) {
  const fs::path path = dir_ / "sub" / "timing.cache";
  auto cache = kiln::TimingCache::forFile(path);
  ASSERT_TRUE(cache.isOk()) << cache.status().message();
  EXPECT_EQ((*cache)->size(), 0u);
  EXPECT_FALSE((*cache)->find("gpu A", "k1").has_value());
  ASSERT_TRUE((*cache)->save().isOk());
  EXPECT_FALSE(fs::exists(path)) << "nothing was added, so nothing is written";

  (*cache)->put("gpu A", "k1", {{"index", 3}});
  (*cache)->put("gpu B", "k1", {{"index", 5}});
  EXPECT_EQ((*cache)->find("gpu A", "k1")->at("index"), 3);
  EXPECT_EQ((*cache)->find("gpu B", "k1")->at("index"), 5);
  EXPECT_FALSE((*cache)->find("gpu C", "k1").has_value());
  ASSERT_TRUE((*cache)->save().isOk());
  const json saved = fileJson(path);
  EXPECT_EQ(saved.at("format"), "kiln timing cache");
  EXPECT_EQ(saved.at("version"), 1);
  EXPECT_EQ(saved.at("devices").at("gpu A").at("k1").at("index"), 3);
  EXPECT_EQ(saved.at("devices").at("gpu B").at("k1").at("index"), 5);

  // The same path is the same cache in a process; the file's text parses back to it.
  auto again = kiln::TimingCache::forFile(path);
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(again->get(), cache->get());
  auto parsed = kiln::TimingCache::parse(kiln::readFileBytes(path).value(), path.string());
  ASSERT_TRUE(parsed.isOk()) << parsed.status().message();
  EXPECT_EQ(parsed->at("gpu A").at("k1").at("index"), 3);
}

TEST_F(TimingCacheFile, AnExistingFileIsLoadedAndOtherProcessesEntriesAreKept) {
  const fs::path path = dir_ / "shared.cache";
  const json existing = {
      {"format", "kiln timing cache"},
      {"version", 1},
      {"devices", {{"gpu A", {{"old", {{"index", 1}}}}}, {"gpu Z", {{"z", {{"index", 9}}}}}}}};
  ASSERT_TRUE(kiln::writeFileAtomically(path, existing.dump()).isOk());
  auto cache = kiln::TimingCache::forFile(path);
  ASSERT_TRUE(cache.isOk()) << cache.status().message();
  EXPECT_EQ((*cache)->size(), 2u);
  EXPECT_EQ((*cache)->find("gpu A", "old")->at("index"), 1);

  // Another process saves an entry after this one loaded the file.
  json other = existing;
  other["devices"]["gpu A"]["theirs"] = {{"index", 7}};
  ASSERT_TRUE(kiln::writeFileAtomically(path, other.dump()).isOk());
  (*cache)->put("gpu A", "mine", {{"index", 2}});
  ASSERT_TRUE((*cache)->save().isOk());
  const json merged = fileJson(path);
  EXPECT_EQ(merged.at("devices").at("gpu A").at("old").at("index"), 1);
  EXPECT_EQ(merged.at("devices").at("gpu A").at("theirs").at("index"), 7);
  EXPECT_EQ(merged.at("devices").at("gpu A").at("mine").at("index"), 2);
  EXPECT_EQ(merged.at("devices").at("gpu Z").at("z").at("index"), 9);
  // ...and this process sees the other's entry from then on.
  EXPECT_EQ((*cache)->find("gpu A", "theirs")->at("index"), 7);

  // An entry that could not be rebuilt is dropped here, then replaced when timed again.
  (*cache)->erase("gpu A", "mine");
  EXPECT_FALSE((*cache)->find("gpu A", "mine").has_value());
  (*cache)->put("gpu A", "mine", {{"index", 4}});
  ASSERT_TRUE((*cache)->save().isOk());
  EXPECT_EQ(fileJson(path).at("devices").at("gpu A").at("mine").at("index"), 4);
}

TEST_F(TimingCacheFile, FilesThatAreNotTimingCachesAreErrorsAndStayAsTheyWere) {
  struct Case {
    std::string name, text, message;
  };
  const std::vector<Case> cases = {
      {"garbage", "not json {", "is not JSON"},
      {"other", R"({"format": "something else"})", "is not a kiln timing cache"},
      {"version", R"({"format": "kiln timing cache", "version": 2, "devices": {}})",
       "has version 2; this kiln reads version 1"},
      {"nodevices", R"({"format": "kiln timing cache", "version": 1})", "no \"devices\" object"},
      {"section", R"({"format": "kiln timing cache", "version": 1, "devices": {"gpu": 3}})",
       "the section of device 'gpu' is not an object"},
      {"entry", R"({"format": "kiln timing cache", "version": 1, "devices": {"gpu": {"k": [1]}}})",
       "entry 'k' of device 'gpu' is not an object"},
      {"truncated", R"({"format": "kiln timing cache", "version": 1, "devices": {"gpu": {"k": )",
       "is not JSON"},
  };
  for (const Case& c : cases) {
    const fs::path path = dir_ / (c.name + ".cache");
    ASSERT_TRUE(kiln::writeFileAtomically(path, c.text).isOk());
    auto cache = kiln::TimingCache::forFile(path);
    ASSERT_FALSE(cache.isOk()) << c.name;
    EXPECT_NE(cache.status().message().find(path.string()), std::string::npos)
        << cache.status().message();
    EXPECT_NE(cache.status().message().find(c.message), std::string::npos)
        << c.name << ": " << cache.status().message();
    EXPECT_EQ(kiln::readFileBytes(path).value(), c.text) << c.name;
  }
}

// An entry's fields are read by type: a hand-edited field of another type reads as missing (the
// choice is stale and the layer is timed again) instead of throwing a JSON type error.
TEST(TimingCacheEntry, FieldsOfAnotherTypeReadAsMissing) {
  const nlohmann::json entry = {{"index", 3}, {"algo", "0a1b"}, {"config", "7"}, {"engine", 2.5}};
  EXPECT_EQ(kiln::entryInt(entry, "index", -1), 3);
  EXPECT_EQ(kiln::entryString(entry, "algo"), "0a1b");
  EXPECT_EQ(kiln::entryInt(entry, "config", -1), -1);
  EXPECT_EQ(kiln::entryInt(entry, "engine", -2), -2);
  EXPECT_EQ(kiln::entryInt(entry, "missing", -1), -1);
  EXPECT_EQ(kiln::entryString(entry, "index"), "");
  EXPECT_EQ(kiln::entryInt(nlohmann::json::array({1}), "index", -1), -1);
  EXPECT_EQ(kiln::entryString(nlohmann::json(5), "algo"), "");
}

TEST_F(TimingCacheFile, TheInMemoryCacheWritesNothingAndAnUnwritablePathIsAnError) {
  auto memory = kiln::TimingCache::forFile("");
  ASSERT_TRUE(memory.isOk());
  (*memory)->put("gpu", "key", {{"index", 1}});
  EXPECT_TRUE((*memory)->save().isOk());
  EXPECT_EQ((*memory)->find("gpu", "key")->at("index"), 1);

  // The cache's folder cannot be made (a file is in the way): the save fails and says where,
  // and the entries stay in memory for a later save.
  ASSERT_TRUE(kiln::writeFileAtomically(dir_ / "file", "x").isOk());
  const fs::path path = dir_ / "file" / "timing.cache";
  auto cache = kiln::TimingCache::forFile(path);
  ASSERT_TRUE(cache.isOk()) << cache.status().message();
  (*cache)->put("gpu", "key", {{"index", 1}});
  const kiln::Status saved = (*cache)->save();
  ASSERT_FALSE(saved.isOk());
  EXPECT_NE(saved.message().find(path.string()), std::string::npos) << saved.message();
  EXPECT_EQ((*cache)->find("gpu", "key")->at("index"), 1);
}

}  // namespace
