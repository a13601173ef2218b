#include "worker/train/model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/script.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>

namespace geo::train {

std::vector<torch::Tensor> Model::parameters() {
  std::vector<torch::Tensor> out;
  for (auto& [name, t] : namedParameters()) out.push_back(t);
  return out;
}

int64_t Model::parameterCount() {
  int64_t n = 0;
  for (auto& [name, t] : namedParameters()) n += t.numel();
  return n;
}

void Model::save(torch::serialize::OutputArchive& archive) {
  for (auto& [name, t] : namedParameters()) archive.write("param." + name, t.detach().cpu());
  for (auto& [name, t] : namedBuffers()) archive.write("buffer." + name, t.detach().cpu(), true);
}

Status Model::load(torch::serialize::InputArchive& archive) {
  torch::NoGradGuard noGrad;
  auto readInto = [&](const std::string& key, torch::Tensor& dst, bool buffer) -> Status {
    torch::Tensor src;
    if (!archive.try_read(key, src, buffer)) {
      return dataLoss(fmt::format("checkpoint has no tensor '{}' for this model", key));
    }
    if (src.sizes() != dst.sizes()) {
      return dataLoss(fmt::format("checkpoint tensor '{}' has shape {} but the model has {}", key,
                                  fmt::join(src.sizes(), "x"), fmt::join(dst.sizes(), "x")));
    }
    dst.copy_(src);  // in place: keeps the trainer's flat-buffer views
    return {};
  };
  for (auto& [name, t] : namedParameters())
    GEO_RETURN_IF_ERROR(readInto("param." + name, t, false));
  for (auto& [name, t] : namedBuffers()) GEO_RETURN_IF_ERROR(readInto("buffer." + name, t, true));
  return {};
}

namespace {

// Wraps a torch::nn module (built-ins).
class ModuleModel : public Model {
 public:
  // `script`: the module's forward in TorchScript, over its parameters and
  // buffers by name (self.fc1.weight); empty where none was written.
  ModuleModel(std::shared_ptr<torch::nn::Module> module,
              std::function<torch::Tensor(const torch::Tensor&)> forward, std::string describe,
              std::string script = {})
      : module_(std::move(module)),
        forward_(std::move(forward)),
        describe_(std::move(describe)),
        script_(std::move(script)) {}

  StatusOr<torch::jit::Module> toTorchScript() override {
    if (script_.empty()) {
      return failedPrecondition(fmt::format("{} has no TorchScript form", describe_));
    }
    // The same tree of modules, parameters and buffers (so that the state
    // dict's names match model.pt's), and the forward written out.
    torch::jit::Module root("geotrain");
    auto place = [&](const std::string& dotted, const torch::Tensor& t, bool parameter) {
      torch::jit::Module* at = &root;
      std::vector<torch::jit::Module> path;
      size_t start = 0;
      std::string name = dotted;
      for (size_t dot = dotted.find('.'); dot != std::string::npos;
           start = dot + 1, dot = dotted.find('.', start)) {
        const std::string part = dotted.substr(start, dot - start);
        // Each submodule a class of its own, named by its path: "0" of a
        // Sequential is no identifier, and one class name for every block's
        // conv1 would be one class in the saved file.
        std::string type = "m_" + dotted.substr(0, dot);
        std::replace(type.begin(), type.end(), '.', '_');
        if (!at->hasattr(part)) at->register_module(part, torch::jit::Module(type));
        path.push_back(at->attr(part).toModule());
        at = &path.back();
        name = dotted.substr(dot + 1);
      }
      const torch::Tensor value = t.detach().cpu().clone();
      if (parameter) {
        at->register_parameter(name, value, /*is_buffer=*/false);
      } else {
        at->register_buffer(name, value);
      }
    };
    for (const auto& [name, t] : namedParameters()) place(name, t, true);
    for (const auto& [name, t] : namedBuffers()) place(name, t, false);
    // `self.training` (train() and eval() set it): batch norm reads it.
    root.register_attribute("training", c10::BoolType::get(), false);
    root.define(script_);
    root.eval();
    return root;
  }

  torch::Tensor forward(const torch::Tensor& input) override { return forward_(input); }
  std::vector<std::pair<std::string, torch::Tensor>> namedParameters() override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& item : module_->named_parameters()) out.emplace_back(item.key(), item.value());
    return out;
  }
  std::vector<std::pair<std::string, torch::Tensor>> namedBuffers() override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& item : module_->named_buffers()) out.emplace_back(item.key(), item.value());
    return out;
  }
  void setTraining(bool on) override { module_->train(on); }
  void to(torch::Device device) override { module_->to(device); }
  std::string describe() const override { return describe_; }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::function<torch::Tensor(const torch::Tensor&)> forward_;
  std::string describe_;
  std::string script_;
};

// The built-ins' forwards in TorchScript, op for op as their C++ forwards
// run (torch::nn::Linear on a matrix is addmm), so that the exported module
// computes the same outputs (to float rounding: TorchScript's executor may
// split the products differently).
constexpr const char* kMlpScript = R"(
def forward(self, x):
    h = torch.relu(torch.addmm(self.fc1.bias, x.flatten(1), self.fc1.weight.t()))
    return torch.addmm(self.fc2.bias, h, self.fc2.weight.t())
)";
constexpr const char* kCnnScript = R"(
def forward(self, x):
    x = torch.max_pool2d(torch.relu(torch.conv2d(x, self.conv1.weight, self.conv1.bias, [1, 1], [2, 2])), [2, 2])
    x = torch.max_pool2d(torch.relu(torch.conv2d(x, self.conv2.weight, self.conv2.bias, [1, 1], [2, 2])), [2, 2])
    h = torch.relu(torch.addmm(self.fc1.bias, x.flatten(1), self.fc1.weight.t()))
    return torch.addmm(self.fc2.bias, h, self.fc2.weight.t())
)";

// ResNet-18's forward (ResNet18Impl below), written out block by block: a
// block is getattr(self.blocks, "i") (TorchScript has no `self.blocks.0`).
// Batch norm as torch::nn::BatchNorm2d runs it (momentum 0.1, eps 1e-5):
// on batch statistics while training, on the running ones in eval().
std::string resnet18Script(const std::vector<std::pair<int64_t, bool>>& blocks) {
  std::string s = R"py(
def _bn(self, x, w, b, mean, var):
    return torch.batch_norm(x, w, b, mean, var, self.training, 0.1, 1e-05, True)

def forward(self, x):
    x = torch.relu(self._bn(torch.conv2d(x, self.stem.weight, None, [1, 1], [1, 1]), self.bn.weight, self.bn.bias, self.bn.running_mean, self.bn.running_var))
)py";
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto [stride, shortcut] = blocks[i];
    const std::string b = fmt::format("getattr(self.blocks, \"{}\")", i);
    const auto bn = [&](const std::string& m) {
      return fmt::format("{0}.weight, {0}.bias, {0}.running_mean, {0}.running_var", m);
    };
    s += fmt::format(
        "    y = torch.relu(self._bn(torch.conv2d(x, {0}.conv1.weight, None, [{1}, {1}], [1, 1]), "
        "{2}))\n"
        "    y = self._bn(torch.conv2d(y, {0}.conv2.weight, None, [1, 1], [1, 1]), {3})\n",
        b, stride, bn(b + ".bn1"), bn(b + ".bn2"));
    if (shortcut) {
      const std::string conv = fmt::format("getattr({}.shortcut, \"0\")", b);
      const std::string norm = fmt::format("getattr({}.shortcut, \"1\")", b);
      s += fmt::format(
          "    x = torch.relu(y + self._bn(torch.conv2d(x, {0}.weight, None, [{1}, {1}], [0, 0]), "
          "{2}))\n",
          conv, stride, bn(norm));
    } else {
      s += "    x = torch.relu(y + x)\n";
    }
  }
  s += "    x = torch.adaptive_avg_pool2d(x, [1, 1]).flatten(1)\n"
       "    return torch.linear(x, self.fc.weight, self.fc.bias)\n";
  return s;
}

// The gpt's forward (GptImpl below), its blocks written out one by one.
std::string gptScript(int64_t layers, int64_t heads, int64_t context) {
  std::string s = fmt::format(R"py(
def _attn(self, x, qkv_w, qkv_b, proj_w, proj_b):
    n, t, c = x.size(0), x.size(1), x.size(2)
    d = c // {0}
    parts = torch.linear(x, qkv_w, qkv_b).split(c, 2)
    q = parts[0].view([n, t, {0}, d]).transpose(1, 2)
    k = parts[1].view([n, t, {0}, d]).transpose(1, 2)
    v = parts[2].view([n, t, {0}, d]).transpose(1, 2)
    att = torch.matmul(q, k.transpose(-2, -1)) / torch.sqrt(float(d))
    future = torch.ones([t, t], device=x.device).triu(1) > 0.5
    att = att.masked_fill(future, float("-inf")).softmax(-1)
    return torch.linear(torch.matmul(att, v).transpose(1, 2).reshape([n, t, c]), proj_w, proj_b)

def forward(self, ids):
    assert ids.dim() == 2 and ids.size(1) <= {1}, "gpt takes token ids [N, T] with T <= {1} (model.context)"
    width = self.tokens.weight.size(1)
    at = torch.arange(ids.size(1), device=ids.device)
    x = torch.embedding(self.tokens.weight, ids) + torch.embedding(self.positions.weight, at)
)py",
                              heads, context);
  for (int64_t i = 0; i < layers; ++i) {
    s += fmt::format(
        "    b = getattr(self.blocks, \"{}\")\n"
        "    x = x + self._attn(torch.layer_norm(x, [width], b.ln1.weight, b.ln1.bias, 1e-05), "
        "b.attn.qkv.weight, b.attn.qkv.bias, b.attn.proj.weight, b.attn.proj.bias)\n"
        "    h = torch.gelu(torch.linear(torch.layer_norm(x, [width], b.ln2.weight, b.ln2.bias, "
        "1e-05), b.fc.weight, b.fc.bias))\n"
        "    x = x + torch.linear(h, b.out.weight, b.out.bias)\n",
        i);
  }
  s += "    return torch.linear(torch.layer_norm(x, [width], self.ln.weight, self.ln.bias, 1e-05), "
       "self.head.weight, None)\n";
  return s;
}

// y = x W^T + b on a matrix x, as torch::nn::Linear computes it (addmm),
// whose weight's gradient is added to the weight's own gradient in place
// (addmm_, beta = 1: one pass) where the weight has one -- the trainer's
// flat gradient buffer -- instead of being made whole and then added.
// Autograd's way held a weight-sized gradient beside the buffer for the
// length of the addition: a model-sized transient when one layer is most
// of the model (the wide mlp: 400 MB of a 101M-parameter worker's peak;
// docs/algorithms.md, "Memory"), and three passes over it where one does.
// The same fusion as Megatron-LM's gradient accumulation fusion. The
// gradients agree with autograd's to float rounding (the product is
// computed as g += go^T x rather than (x^T go)^T, which BLAS may sum in
// another order).
struct AccumulatingLinear : torch::autograd::Function<AccumulatingLinear> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias) {
    ctx->save_for_backward({x});
    // The parameter itself (not a saved copy of its data): backward adds
    // to its .grad. The optimizer changes it only after backward.
    ctx->saved_data["weight"] = weight;
    return torch::addmm(bias, x, weight.t());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::Tensor& go = grads[0];
    const torch::Tensor x = ctx->get_saved_variables()[0];
    torch::Tensor weight = ctx->saved_data["weight"].toTensor();
    torch::Tensor gx, gw, gb;
    if (ctx->needs_input_grad(0)) gx = go.mm(weight);
    if (ctx->needs_input_grad(1)) {
      torch::Tensor& g = weight.mutable_grad();
      if (g.defined() && g.sizes() == weight.sizes() && g.scalar_type() == go.scalar_type()) {
        g.addmm_(go.t(), x);  // gw stays undefined: nothing more to add
      } else {
        gw = go.t().mm(x);
      }
    }
    if (ctx->needs_input_grad(2)) gb = go.sum(0);
    return {gx, gw, gb};
  }
};

torch::Tensor accumulatingLinear(torch::nn::Linear& layer, const torch::Tensor& x) {
  if (!torch::GradMode::is_enabled() || x.dim() != 2 || !layer->bias.defined()) return layer(x);
  return AccumulatingLinear::apply(x, layer->weight, layer->bias);
}

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t classes, int64_t hidden)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, classes))) {}
  torch::Tensor forward(torch::Tensor x) {
    return accumulatingLinear(fc2, torch::relu(accumulatingLinear(fc1, x.flatten(1))));
  }
  torch::nn::Linear fc1, fc2;
};

// Two 5x5 conv layers (16, 32 channels, each followed by 2x2 max-pooling)
// and two linear layers, for 28x28 (or any HxW divisible by 4) inputs. Small
// enough to train on a laptop CPU in minutes.
struct CnnImpl : torch::nn::Module {
  CnnImpl(int64_t channels, int64_t h, int64_t w, int64_t classes)
      : conv1(register_module(
            "conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, 16, 5).padding(2)))),
        conv2(register_module("conv2",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5).padding(2)))),
        fc1(register_module("fc1", torch::nn::Linear(32 * (h / 4) * (w / 4), 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, classes))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    return fc2(torch::relu(fc1(x.flatten(1))));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};

struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module(
            "conv1",
            torch::nn::Conv2d(
                torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(out))),
        conv2(register_module(
            "conv2",
            torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      shortcut = register_module(
          "shortcut",
          torch::nn::Sequential(
              torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
              torch::nn::BatchNorm2d(out)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    auto y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    return torch::relu(y + (shortcut ? shortcut->forward(x) : x));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

// ResNet-18 for 32x32 inputs (CIFAR variant: 3x3 stem, no max-pool).
struct ResNet18Impl : torch::nn::Module {
  ResNet18Impl(int64_t channels, int64_t classes)
      : stem(register_module(
            "stem",
            torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, 64, 3).padding(1).bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(64))),
        fc(register_module("fc", torch::nn::Linear(512, classes))) {
    int64_t in = 64;
    const int64_t widths[] = {64, 128, 256, 512};
    for (int stage = 0; stage < 4; ++stage) {
      for (int b = 0; b < 2; ++b) {
        const int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
        blocks->push_back(BasicBlock(in, widths[stage], stride));
        layout.emplace_back(stride, stride != 1 || in != widths[stage]);
        in = widths[stage];
      }
    }
    register_module("blocks", blocks);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn(stem(x)));
    x = blocks->forward(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return fc(x);
  }
  torch::nn::Conv2d stem;
  torch::nn::BatchNorm2d bn;
  torch::nn::Sequential blocks;
  torch::nn::Linear fc;
  std::vector<std::pair<int64_t, bool>>
      layout;  // each block's stride, and whether it has a shortcut
};

// A decoder-only transformer (GPT-2's shape, small): token and position
// embeddings, `layers` blocks of pre-norm causal self-attention and a 4x
// MLP, a final LayerNorm and a linear head to the vocabulary. Inputs are
// token ids [N, T] (T <= context), outputs next-token logits [N, T, vocab].
struct CausalSelfAttentionImpl : torch::nn::Module {
  CausalSelfAttentionImpl(int64_t width, int64_t headCount)
      : heads(headCount),
        qkv(register_module("qkv", torch::nn::Linear(width, 3 * width))),
        proj(register_module("proj", torch::nn::Linear(width, width))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t n = x.size(0), t = x.size(1), c = x.size(2), d = c / heads;
    const auto parts = qkv(x).split(c, 2);
    const auto split = [&](const torch::Tensor& p) {
      return p.view({n, t, heads, d}).transpose(1, 2);  // [N, heads, T, d]
    };
    const auto q = split(parts[0]), k = split(parts[1]), v = split(parts[2]);
    auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
    // Each position attends to itself and the ones before it.
    const auto future =
        torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    att = att.masked_fill(future, -std::numeric_limits<float>::infinity()).softmax(-1);
    return proj(torch::matmul(att, v).transpose(1, 2).reshape({n, t, c}));
  }
  int64_t heads;
  torch::nn::Linear qkv, proj;
};
TORCH_MODULE(CausalSelfAttention);

struct GptBlockImpl : torch::nn::Module {
  GptBlockImpl(int64_t width, int64_t heads)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        attn(register_module("attn", CausalSelfAttention(width, heads))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        fc(register_module("fc", torch::nn::Linear(width, 4 * width))),
        out(register_module("out", torch::nn::Linear(4 * width, width))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln1(x));
    return x + out(torch::gelu(fc(ln2(x))));
  }
  torch::nn::LayerNorm ln1;
  CausalSelfAttention attn;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc, out;
};
TORCH_MODULE(GptBlock);

struct GptImpl : torch::nn::Module {
  GptImpl(int64_t vocab, int64_t window, int64_t width, int64_t layers, int64_t heads)
      : context(window),
        tokens(register_module("tokens", torch::nn::Embedding(vocab, width))),
        positions(register_module("positions", torch::nn::Embedding(window, width))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))),
        head(register_module(
            "head", torch::nn::Linear(torch::nn::LinearOptions(width, vocab).bias(false)))) {
    for (int64_t i = 0; i < layers; ++i) blocks->push_back(GptBlock(width, heads));
    // GPT-2's initialization of the embeddings (LibTorch's is N(0, 1)).
    torch::NoGradGuard noGrad;
    tokens->weight.normal_(0, 0.02);
    positions->weight.normal_(0, 0.02);
  }
  torch::Tensor forward(const torch::Tensor& ids) {
    TORCH_CHECK(ids.dim() == 2 && ids.size(1) <= context,
                "gpt takes token ids [N, T] with T <= ", context, " (model.context), got ",
                ids.sizes());
    const auto at =
        torch::arange(ids.size(1), torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
    torch::Tensor x = tokens(ids) + positions(at);
    for (const auto& block : *blocks) x = block->as<GptBlock>()->forward(x);
    return head(ln(x));
  }
  int64_t context;
  torch::nn::Embedding tokens, positions;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln;
  torch::nn::Linear head;
};

// A TorchScript module trained from C++: parameters are its attributes,
// forward is its `forward` method.
class ScriptModel : public Model {
 public:
  ScriptModel(torch::jit::Module module, std::string path)
      : module_(std::move(module)), path_(std::move(path)) {}

  torch::Tensor forward(const torch::Tensor& input) override {
    return module_.forward({input}).toTensor();
  }
  std::vector<std::pair<std::string, torch::Tensor>> namedParameters() override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true))
      out.emplace_back(p.name, p.value);
    return out;
  }
  std::vector<std::pair<std::string, torch::Tensor>> namedBuffers() override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) out.emplace_back(b.name, b.value);
    return out;
  }
  void setTraining(bool on) override { module_.train(on); }
  void to(torch::Device device) override { module_.to(device); }
  std::string describe() const override { return "torchscript " + path_; }
  StatusOr<torch::jit::Module> toTorchScript() override {
    torch::jit::Module copy = module_.deepcopy();
    copy.to(torch::kCPU);
    copy.eval();
    return copy;
  }

 private:
  torch::jit::Module module_;
  std::string path_;
};

}  // namespace

StatusOr<std::vector<std::filesystem::path>> exportModel(Model& model,
                                                         const std::filesystem::path& dir,
                                                         const std::string& metadata) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return failedPrecondition(
        fmt::format("output.path: cannot create {}: {}", dir.string(), ec.message()));
  }
  std::vector<fs::path> written;
  // Writes beside `name`, then renames over it.
  auto place = [&](const std::string& name,
                   const std::function<void(const fs::path&)>& write) -> Status {
    const fs::path final = dir / name;
    const fs::path partial = dir / (name + ".partial");
    try {
      write(partial);
    } catch (const std::exception& e) {
      fs::remove(partial, ec);
      return failedPrecondition(fmt::format("cannot write {}: {}", final.string(), e.what()));
    }
    fs::rename(partial, final, ec);
    if (ec) {
      return failedPrecondition(fmt::format("cannot write {}: {}", final.string(), ec.message()));
    }
    written.push_back(final);
    return {};
  };
  auto writeBytes = [](const fs::path& path, const char* data, size_t size) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(data, static_cast<std::streamsize>(size));
    out.close();
    if (!out) throw std::runtime_error(std::strerror(errno));
  };
  GEO_RETURN_IF_ERROR(place("model.pt", [&](const fs::path& path) {
    c10::Dict<std::string, torch::Tensor> state;
    for (const auto& [name, t] : model.namedParameters()) state.insert(name, t.detach().cpu());
    for (const auto& [name, t] : model.namedBuffers()) state.insert(name, t.detach().cpu());
    const std::vector<char> bytes = torch::pickle_save(state);
    writeBytes(path, bytes.data(), bytes.size());
  }));
  auto scripted = model.toTorchScript();
  if (scripted.ok()) {
    GEO_RETURN_IF_ERROR(place("model.torchscript.pt",
                              [&](const fs::path& path) { scripted->save(path.string()); }));
  }
  GEO_RETURN_IF_ERROR(place("model.json", [&](const fs::path& path) {
    writeBytes(path, metadata.data(), metadata.size());
  }));
  return written;
}

StatusOr<std::unique_ptr<Model>> makeModel(const ModelSpec& spec,
                                           const std::vector<int64_t>& inputShape,
                                           int64_t numClasses) {
  if (inputShape.empty()) {
    return invalidArgument("model input shape is empty: each sample must have at least one value");
  }
  int64_t features = 1;
  for (const int64_t d : inputShape) features *= d;
  // The convolutional models take images, [C, H, W].
  const bool image = inputShape.size() == 3;
  const int64_t c = image ? inputShape[0] : 0, h = image ? inputShape[1] : 0,
                w = image ? inputShape[2] : 0;
  if (!image && spec.torchscript.empty() && spec.builtin != "mlp" && spec.builtin != "gpt") {
    return invalidArgument(fmt::format(
        "model.builtin {} takes images [C, H, W]; the data's samples are [{}] (allowed: mlp, or "
        "a TorchScript model)",
        spec.builtin, fmt::join(inputShape, ", ")));
  }
  if (!spec.torchscript.empty()) {
    if (!std::filesystem::exists(spec.torchscript)) {
      return notFound(
          fmt::format("model.torchscript: file {} does not exist", spec.torchscript.string()));
    }
    try {
      torch::jit::Module m = torch::jit::load(spec.torchscript.string());
      auto model = std::make_unique<ScriptModel>(std::move(m), spec.torchscript.string());
      if (model->namedParameters().empty()) {
        return invalidArgument(fmt::format("model.torchscript: {} has no parameters to train",
                                           spec.torchscript.string()));
      }
      return std::unique_ptr<Model>(std::move(model));
    } catch (const c10::Error& e) {
      return invalidArgument(fmt::format("model.torchscript: cannot load {}: {}",
                                         spec.torchscript.string(), e.what_without_backtrace()));
    }
  }
  if (spec.builtin == "gpt") {
    if (inputShape.size() != 1) {
      return invalidArgument(fmt::format(
          "model.builtin gpt takes token ids [N, T]; the data's samples are [{}] (allowed: "
          "dataset.name: tokens)",
          fmt::join(inputShape, ", ")));
    }
    const int64_t width = spec.width > 0 ? spec.width : 128;
    if (width % spec.heads != 0) {
      return invalidArgument(
          fmt::format("model.heads: {} is not allowed (allowed: a divisor of model.width = {})",
                      spec.heads, width));
    }
    auto m = std::make_shared<GptImpl>(numClasses, spec.context, width, spec.layers, spec.heads);
    return std::unique_ptr<Model>(std::make_unique<ModuleModel>(
        m, [m](const torch::Tensor& x) { return m->forward(x); },
        fmt::format("gpt {} layers, width {}, {} heads, context {}, vocabulary {}", spec.layers,
                    width, spec.heads, spec.context, numClasses),
        gptScript(spec.layers, spec.heads, spec.context)));
  }
  if (spec.builtin == "mlp") {
    const int64_t hidden = spec.width > 0 ? spec.width : 256;
    auto m = std::make_shared<MlpImpl>(features, numClasses, hidden);
    return std::unique_ptr<Model>(std::make_unique<ModuleModel>(
        m, [m](const torch::Tensor& x) { return m->forward(x); },
        fmt::format("mlp {}-{}-{}", features, hidden, numClasses), kMlpScript));
  }
  if (spec.builtin == "cnn") {
    if (h % 4 != 0 || w % 4 != 0) {
      return invalidArgument(
          fmt::format("model cnn needs height and width divisible by 4, got {}x{}", h, w));
    }
    auto m = std::make_shared<CnnImpl>(c, h, w, numClasses);
    return std::unique_ptr<Model>(std::make_unique<ModuleModel>(
        m, [m](const torch::Tensor& x) { return m->forward(x); }, "cnn conv16-conv32-128",
        kCnnScript));
  }
  if (spec.builtin == "resnet18") {
    auto m = std::make_shared<ResNet18Impl>(c, numClasses);
    return std::unique_ptr<Model>(std::make_unique<ModuleModel>(
        m, [m](const torch::Tensor& x) { return m->forward(x); }, "resnet18 (CIFAR variant)",
        resnet18Script(m->layout)));
  }
  return invalidArgument(
      fmt::format("model.builtin: '{}' is not a model (allowed: mlp, cnn, resnet18, gpt; or set "
                  "model.torchscript)",
                  spec.builtin));
}

}  // namespace geo::train
