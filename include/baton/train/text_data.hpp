// baton/train/text_data.hpp — byte-level language-model data from a text file: deterministic
// training batches, a held-out evaluation batch, and packed documents.
#pragma once

#include <baton/nn/error.hpp>
#include <baton/payload/host_tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace baton::train {

/// A global batch of a language model: every rank of a training mesh is given the same one
/// and takes its data-parallel rows and its context-parallel shard of the sequence.
struct lm_batch {
  host_tensor<std::int64_t> tokens;   ///< [rows, seq]
  host_tensor<std::int64_t> targets;  ///< [rows, seq]: the next token, or ignore_index
  /// Optional, for packed sequences: [rows, seq] document ids (attention stays inside a
  /// document, and the last token of a document predicts nothing).
  std::shared_ptr<const host_tensor<std::int64_t>> documents;
};

/// The target that counts for nothing (torch's ignore_index, baton::nn::cross_entropy's
/// default).
inline constexpr std::int64_t ignore_target = -100;

/// The bytes of a text as tokens 0..255. The last `eval_fraction` of the text is held out for
/// evaluation. Documents, for packed sequences, are the paragraphs (separated by a blank
/// line).
class byte_corpus {
 public:
  static constexpr std::int64_t vocab = 256;

  explicit byte_corpus(std::string text, double eval_fraction = 0.1) : text_(std::move(text)) {
    const auto n = static_cast<std::int64_t>(text_.size());
    if (!(eval_fraction > 0 && eval_fraction < 1))
      throw nn::nn_error("baton::train::byte_corpus: eval_fraction must be in (0, 1)");
    train_end_ = n - static_cast<std::int64_t>(static_cast<double>(n) * eval_fraction);
    document_.resize(text_.size());
    std::int64_t doc = 0;
    for (std::size_t i = 0; i < text_.size(); ++i) {
      document_[i] = doc;
      if (i > 0 && text_[i] == '\n' && text_[i - 1] == '\n') ++doc;  // a blank line ends a paragraph
    }
  }

  /// Reads `path`; throws nn_error naming the file when it cannot be read.
  static byte_corpus from_file(const std::string& path, double eval_fraction = 0.1) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw nn::nn_error("baton::train::byte_corpus: cannot read the text file '" + path + "'");
    std::ostringstream s;
    s << in.rdbuf();
    return byte_corpus(s.str(), eval_fraction);
  }

  std::int64_t size() const noexcept { return static_cast<std::int64_t>(text_.size()); }
  std::int64_t train_size() const noexcept { return train_end_; }
  const std::string& text() const noexcept { return text_; }

  /// Training batch number `step`: `rows` windows of seq + 1 bytes of the training part, at
  /// offsets spread over the text by a fixed stride (the same on every run and every rank).
  /// Throws nn_error when the training part is shorter than seq + 1 bytes.
  lm_batch train_batch(std::int64_t step, std::int64_t rows, std::int64_t seq, bool packed) const {
    const std::int64_t span = train_end_ - seq - 1;
    if (span < 1)
      throw nn::nn_error("baton::train::byte_corpus: the training part of the text holds " + std::to_string(train_end_) +
                         " bytes, too few for sequences of " + std::to_string(seq) +
                         "; use a longer text or a shorter sequence");
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto i = static_cast<std::uint64_t>(step * rows + r);
      offsets[static_cast<std::size_t>(r)] = static_cast<std::int64_t>((i * 2654435761ULL) % static_cast<std::uint64_t>(span));
    }
    return windows(offsets, seq, packed);
  }

  /// The evaluation batch: `rows` windows of the held-out part (the same every call).
  lm_batch eval_batch(std::int64_t rows, std::int64_t seq, bool packed) const {
    const std::int64_t span = size() - train_end_ - seq - 1;
    if (span < 1)
      throw nn::nn_error("baton::train::byte_corpus: the held-out part of the text holds " +
                         std::to_string(size() - train_end_) + " bytes, too few for sequences of " +
                         std::to_string(seq) + "; use a longer text or a shorter sequence");
    std::vector<std::int64_t> offsets(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) offsets[static_cast<std::size_t>(r)] = train_end_ + r * span / std::max<std::int64_t>(rows, 1);
    return windows(offsets, seq, packed);
  }

 private:
  lm_batch windows(const std::vector<std::int64_t>& offsets, std::int64_t seq, bool packed) const {
    const auto rows = static_cast<std::int64_t>(offsets.size());
    lm_batch b{host_tensor<std::int64_t>({rows, seq}), host_tensor<std::int64_t>({rows, seq}), nullptr};
    host_tensor<std::int64_t> docs({rows, seq});
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto o = static_cast<std::size_t>(offsets[static_cast<std::size_t>(r)]);
      for (std::int64_t s = 0; s < seq; ++s) {
        const std::size_t i = o + static_cast<std::size_t>(s);
        b.tokens(r, s) = static_cast<unsigned char>(text_[i]);
        b.targets(r, s) = static_cast<unsigned char>(text_[i + 1]);
        docs(r, s) = document_[i];
        if (packed && document_[i + 1] != document_[i]) b.targets(r, s) = ignore_target;  // a document's last byte
      }
    }
    if (packed) b.documents = std::make_shared<const host_tensor<std::int64_t>>(std::move(docs));
    return b;
  }

  std::string text_;
  std::vector<std::int64_t> document_;
  std::int64_t train_end_ = 0;
};

}  // namespace baton::train
