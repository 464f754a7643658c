"""Hugging Face transformers classes around model.py, for checkpoints exported by tools/export.py.

export.py copies this file and model.py into the exported folder, and transformers imports them
from there with `trust_remote_code=True` (hence the relative import: cram itself never imports
this file). The wrappers only translate: config.json <-> CrammedBert's arguments, the attention
mask <-> our padding mask, and our tensors <-> transformers' output classes.

    from transformers import AutoModelForMaskedLM, AutoTokenizer
    model = AutoModelForMaskedLM.from_pretrained("out/quickstart/hf", trust_remote_code=True)
"""
import dataclasses
import inspect

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput, SequenceClassifierOutput

from .model import ClassificationHead, CrammedBert, ModelConfig

MODEL_ARGS = {f.name: f.default for f in dataclasses.fields(ModelConfig)}  # the fields and their defaults
HEAD_ARGS = {name: p.default for name, p in inspect.signature(ClassificationHead).parameters.items()
             if p.default is not p.empty}  # hidden, dropout, pooling, sep_id, texts: config.json's classifier_<name>


def padding_mask(attention_mask):
    """transformers' attention_mask (B, T), 1 at real tokens -> model.py's padding mask (True there), or None."""
    return None if attention_mask is None else attention_mask.bool()


class CramConfig(PretrainedConfig):
    """model.ModelConfig's fields, plus the GLUE head's settings (ClassificationHead's keyword
    arguments as classifier_hidden, classifier_dropout, classifier_pooling, classifier_sep_id and
    classifier_texts, the texts a row holds for the pair head)."""
    model_type = "cram"
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                     "intermediate_size": "d_ffn", "max_position_embeddings": "seq_len"}

    def __init__(self, **kwargs):
        for name, default in MODEL_ARGS.items():
            setattr(self, name, kwargs.pop(name, default))
        for name, default in HEAD_ARGS.items():
            setattr(self, f"classifier_{name}", kwargs.pop(f"classifier_{name}", default))
        super().__init__(**kwargs)

    def model_args(self):
        return {name: getattr(self, name) for name in MODEL_ARGS}

    def head_args(self):
        return {name: getattr(self, f"classifier_{name}") for name in HEAD_ARGS}


class CramPreTrainedModel(PreTrainedModel):
    config_class = CramConfig
    base_model_prefix = "cram"  # every class keeps the encoder as `cram`, so one file of weights loads in all

    def _init_weights(self, module):
        """Start what the file does not hold (a new classification head) as model.py starts it, and
        rebuild every buffer that is not stored (the positions table; any a fork's switch adds) as model.py
        builds it, from a fresh model of the same config. transformers calls this on each module."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            CrammedBert._init_weights(module)
        elif isinstance(module, CrammedBert):
            stored = set(module.state_dict())
            unstored = [name for name, _ in module.named_buffers() if name not in stored]
            if unstored:
                with torch.device("cpu"):
                    fresh = CrammedBert(**dataclasses.asdict(module.config))
                for name in unstored:
                    module.get_buffer(name).copy_(fresh.get_buffer(name))

    def get_input_embeddings(self):
        return self.cram.tok_emb

    def set_input_embeddings(self, value):
        self.cram.tok_emb = value


class CramModel(CramPreTrainedModel):
    """The encoder: final hidden states (AutoModel)."""

    def __init__(self, config):
        super().__init__(config)
        self.cram = CrammedBert(**config.model_args())
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, return_dict=None, **kwargs):
        # token_type_ids are accepted and ignored: the model has no segment embeddings
        return BaseModelOutput(last_hidden_state=self.cram.encode(input_ids, padding_mask(attention_mask)))


class CramForMaskedLM(CramPreTrainedModel):
    """Encoder + the tied output layer: logits at every position (AutoModelForMaskedLM, fill-mask)."""

    def __init__(self, config):
        super().__init__(config)
        self.cram = CrammedBert(**config.model_args())
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, return_dict=None, **kwargs):
        logits = self.cram.logits(self.cram.encode(input_ids, padding_mask(attention_mask)))  # (B, T, V)
        loss = None
        if labels is not None:  # -100 marks positions without a target
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
        return MaskedLMOutput(loss=loss, logits=logits)


class CramForSequenceClassification(CramPreTrainedModel):
    """Encoder + the reference GLUE head (pooling: config.classifier_pooling); num_labels=1 regresses
    (AutoModelForSequenceClassification)."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.cram = CrammedBert(**config.model_args())
        self.head = ClassificationHead(config.d_model, config.num_labels, **config.head_args())
        self.post_init()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, return_dict=None, **kwargs):
        mask = padding_mask(attention_mask)
        logits = self.head(self.cram.encode(input_ids, mask), mask, input_ids)  # (B, num_labels)
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = F.mse_loss(logits[:, 0].float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels.long())
        return SequenceClassifierOutput(loss=loss, logits=logits)
