// The text the trainer tests train on: paragraphs (documents for the packed cases) made up so
// that no test reads a file. One definition for every test source of test_train.
#pragma once

#include <baton/train/text_data.hpp>

#include <string>

namespace train_test {

inline std::string words_text() {
  std::string t;
  const char* words[] = {"pipeline", "stage", "ring", "shard", "token", "attention", "gradient", "schedule"};
  for (int i = 0; i < 900; ++i) {
    t += words[(i * 7 + i / 5) % 8];
    t += (i % 23 == 22) ? "\n\n" : (i % 9 == 8 ? ". " : " ");
  }
  return t;
}

inline const baton::train::byte_corpus& words_corpus() {
  static const baton::train::byte_corpus c(words_text());
  return c;
}

}  // namespace train_test
