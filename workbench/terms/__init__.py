"""Terms of the Transformer equation and projections onto its constraint sets."""

from ._activations import (
    gelu as gelu,
    gelu_tanh as gelu_tanh,
    relu as relu,
    tanh as tanh,
)
from ._attention import MultiHeadAttention as MultiHeadAttention
from ._base import AbstractProjection as AbstractProjection, AbstractTerm as AbstractTerm
from ._convolution import (
    ConvolutionalAttention as ConvolutionalAttention,
    DepthwiseConvolution as DepthwiseConvolution,
)
from ._feedforward import FeedForward as FeedForward, LinearKernel as LinearKernel
from ._projections import (
    LayerNormProjection as LayerNormProjection,
    NonnegativeProjection as NonnegativeProjection,
    SphereProjection as SphereProjection,
)
