"""Exact recoveries of published architectures, and loading their weights."""

from ._cvt import (
    ConvTokenEmbedding as ConvTokenEmbedding,
    CvT as CvT,
    CvTStage as CvTStage,
    cvt_from_hf as cvt_from_hf,
)
from ._direct import (
    direct_bert as direct_bert,
    direct_cvt as direct_cvt,
    direct_encoder as direct_encoder,
    direct_gpt2 as direct_gpt2,
    direct_vit as direct_vit,
)
from ._loaders import (
    bert_from_hf as bert_from_hf,
    encoder_from_torch as encoder_from_torch,
    gpt2_from_hf as gpt2_from_hf,
)
from ._model import (
    BERT as BERT,
    GPT2 as GPT2,
    BertEmbeddings as BertEmbeddings,
    GPT2Embeddings as GPT2Embeddings,
    Transformer as Transformer,
    transformer_equation as transformer_equation,
)
from ._paper_a import PaperAEncoder as PaperAEncoder
from ._random import (
    bert_config as bert_config,
    cvt_config as cvt_config,
    gpt2_config as gpt2_config,
    random_bert_state_dict as random_bert_state_dict,
    random_cvt_state_dict as random_cvt_state_dict,
    random_encoder_state_dict as random_encoder_state_dict,
    random_gpt2_state_dict as random_gpt2_state_dict,
    random_vit_state_dict as random_vit_state_dict,
    vit_config as vit_config,
)
from ._reference import (
    have_reference as have_reference,
    hf_bert as hf_bert,
    hf_cvt as hf_cvt,
    hf_gpt2 as hf_gpt2,
    hf_vit as hf_vit,
    run_reference as run_reference,
    torch_encoder as torch_encoder,
)
from ._vision import (
    ViT as ViT,
    ViTEmbeddings as ViTEmbeddings,
    vit_from_hf as vit_from_hf,
    vit_to_hf as vit_to_hf,
)
