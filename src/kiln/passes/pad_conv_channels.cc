// Pads the input channels of an NHWC convolution up to a multiple of 4 or 8 on the GPU
// (cuda.conv.pad_channels): an image stem's 3 channels become 4 or 8, zeros in the input and in
// the weights, so cuDNN may take a tensor-core kernel that wants aligned channels instead of the
// general ones that take any count. The sum over the added channels is zero, so the result is the
// convolution's own.
//
//   %y = kiln.NhwcConv "stem" (%x [1,224,224,3], %w [7,7,3,64], %b)
//     =>   %x_padded = Pad "stem_pad_channels" (%x, [0,0,0,0,0,0,0,5])   [1,224,224,8]
//          %y = kiln.NhwcConv "stem" (%x_padded, %w_padded [7,7,8,64], %b)
//
// Runs after layout_nhwc (the convolutions are NHWC then), only for the CUDA backend, and only on
// ungrouped convolutions with constant weights. The Pad is one more copy of the input, which a
// stem's input (3 channels of an image) keeps small.
#include "kiln/ir/op_schema.h"
#include "kiln/passes/conv_weights.h"
#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kPadConvChannels = knobs::declareKnob({
    .name = "cuda.conv.pad_channels",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"off", "4", "8"},
    .defaultValue = "off",
    .help = "an ungrouped NHWC convolution whose input channels are not a multiple of 4 (or 8) "
            "reads them zero-padded up to one (a Pad before it, zero weights for the new "
            "channels), so cuDNN can pick tensor-core kernels that need aligned channels: an "
            "image stem's 3 channels become 4 or 8",
    .backends = {"cuda"},
    .perNode = true,
});

Status padConvChannels(ir::Graph& graph, PassContext& context) {
  if (context.backend != "cuda") return Status::ok();
  std::vector<ir::Node*> convs;
  for (const auto& node : graph.nodes()) {
    if (node->domain == ir::kKilnDomain && node->opType == "NhwcConv") convs.push_back(node.get());
  }
  for (ir::Node* conv : convs) {
    const std::string setting = context.route.value(kPadConvChannels, conv);
    if (setting == "off") continue;
    const int64_t multiple = std::stoll(setting);
    auto group = conv->getInt("group", 1);
    ir::Value* x = conv->input(0);
    const ir::Value* w = conv->input(1);
    if (!group.isOk() || *group != 1 || !x || !x->hasType || x->shape.rank() != 4 || !w ||
        !w->constant || w->shape.rank() != 4 || !isFoldableFloat(w->dtype)) {
      continue;
    }
    const int64_t channels = x->shape[3];
    if (channels % multiple == 0 || w->shape[2] != channels) continue;
    const int64_t padded = (channels + multiple - 1) / multiple * multiple;

    // The weights [kH, kW, C, M] -> [kH, kW, padded, M], the new input channels' rows zero.
    const int64_t taps = w->shape[0] * w->shape[1], outputs = w->shape[3];
    const std::vector<double> values = tensorValues(*w->constant);
    std::vector<double> wider(static_cast<size_t>(taps * padded * outputs), 0.0);
    for (int64_t t = 0; t < taps; ++t) {
      for (int64_t c = 0; c < channels; ++c) {
        for (int64_t m = 0; m < outputs; ++m) {
          wider[static_cast<size_t>((t * padded + c) * outputs + m)] =
              values[static_cast<size_t>((t * channels + c) * outputs + m)];
        }
      }
    }
    ir::Shape wideShape = w->shape;
    wideShape[2] = padded;
    ir::Value* wideWeights =
        addFoldedConstant(graph, w->name + "_padded", w->dtype, wideShape, wider);
    ir::Value* pads =
        addFoldedConstant(graph, conv->name + "_channel_pads", ir::DType::kInt64, ir::Shape{8},
                          {0, 0, 0, 0, 0, 0, 0, static_cast<double>(padded - channels)});

    ir::Node* pad = graph.insertNode("Pad", conv);
    pad->name = conv->name + "_pad_channels";
    pad->opsetVersion = 18;
    pad->inputs = {x, pads};
    ir::Value* wideInput = graph.addUniqueValue(x->name + "_padded");
    wideInput->dtype = x->dtype;
    wideInput->shape = x->shape;
    wideInput->shape[3] = padded;
    wideInput->hasType = true;
    wideInput->producer = pad;
    pad->outputs = {wideInput};
    conv->inputs[0] = wideInput;
    conv->inputs[1] = wideWeights;
    context.note("padded NhwcConv '{}' from {} to {} input channels", conv->name, channels, padded);
  }
  return Status::ok();
}

}  // namespace kiln::passes
