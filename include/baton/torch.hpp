// baton/torch.hpp — the LibTorch adapter (component `torch`, target baton::torch): torch::Tensor
// payloads, torch::nn modules as pipeline stages with autograd gradients, a LibTorch loss,
// baton's context-parallel attention as an autograd function, and gradient reduction and
// clipping over .grad(). See docs/torch.md.
#pragma once

#include <baton/torch/cp_attention.hpp>
#include <baton/torch/gradients.hpp>
#include <baton/torch/loss.hpp>
#include <baton/torch/payload.hpp>
#include <baton/torch/stage.hpp>
