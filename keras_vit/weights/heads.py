"""What a foreign file's model returns by default, so that keras-vit's model of it returns the same.

One table: each source class keras-vit reads -> its head, and each head -> the default output.
A classifier outputs probabilities (softmax over the head's logits, as `keras.applications` does;
`classifier_activation=None` gives the logits); a projection outputs the embedding after it (CLIP's
`image_embeds`); a backbone outputs the pooled representation (the source's `pooler_output`).
"""

CLASSIFIER, PROJECTION, BACKBONE = "classifier", "projection", "backbone"

# (library, class) -> head. timm's VisionTransformer is one class whose head depends on the file:
# its rows say which file. A class not here whose file holds a head is refused by name.
HEADS = {
    ("transformers", "ViTModel"): BACKBONE,
    ("transformers", "ViTForImageClassification"): CLASSIFIER,
    ("transformers", "DeiTModel"): BACKBONE,
    # its classifier reads the class token alone beside the distillation token: not built (logged)
    ("transformers", "DeiTForImageClassification"): BACKBONE,
    ("transformers", "DeiTForImageClassificationWithTeacher"): CLASSIFIER,
    ("transformers", "Dinov2Model"): BACKBONE,
    ("transformers", "Dinov2Backbone"): BACKBONE,
    ("transformers", "Dinov2ForImageClassification"): CLASSIFIER,
    ("transformers", "Dinov2WithRegistersForImageClassification"): CLASSIFIER,
    ("transformers", "Dinov2WithRegistersModel"): BACKBONE,
    ("transformers", "Dinov2WithRegistersBackbone"): BACKBONE,
    ("transformers", "CLIPVisionModel"): BACKBONE,
    ("transformers", "CLIPVisionModelWithProjection"): PROJECTION,
    ("transformers", "CLIPModel"): PROJECTION,
    ("transformers", "CLIPForImageClassification"): CLASSIFIER,
    ("transformers", "SiglipVisionModel"): BACKBONE,
    ("transformers", "SiglipModel"): BACKBONE,
    ("transformers", "SiglipForImageClassification"): CLASSIFIER,
    ("transformers", "Siglip2ForImageClassification"): CLASSIFIER,
    ("transformers", "ViTMAEModel"): BACKBONE,
    ("transformers", "ViTMAEForPreTraining"): BACKBONE,  # its encoder (the decoder dropped, logged)
    ("transformers", "ViTMSNModel"): BACKBONE,
    ("transformers", "ViTMSNForImageClassification"): CLASSIFIER,
    ("transformers", "IJepaModel"): BACKBONE,
    ("transformers", "IJepaForImageClassification"): CLASSIFIER,
    ("transformers", "Aimv2VisionModel"): BACKBONE,
    ("transformers", "Aimv2Model"): PROJECTION,
    ("transformers", "BeitModel"): BACKBONE,
    ("transformers", "BeitForImageClassification"): CLASSIFIER,
    ("transformers", "Data2VecVisionModel"): BACKBONE,
    ("transformers", "Data2VecVisionForImageClassification"): CLASSIFIER,
    ("timm", "VisionTransformer with a head (ViT, DeiT, DeiT III, CLIP fine-tuned)"): CLASSIFIER,
    ("timm", "VisionTransformer of a CLIP tower (norm_pre) whose head has a zero bias"): PROJECTION,
    ("timm", "VisionTransformer without a head (num_classes=0: DINOv2, SigLIP, ...)"): BACKBONE,
}
# head -> (what the model returns by default, classifier_activation for it)
OUTPUTS = {CLASSIFIER: ("probabilities", "softmax"), PROJECTION: ("embeddings", None),
           BACKBONE: ("the pooled representation", None)}


def hf_head(name, built):
    """The head of the Hugging Face class `name` (config.json's `architectures[0]`, None when it is
    missing), given what the weights hold: `built` is CLASSIFIER, PROJECTION or None (no head).

    Raises ValueError naming the class when it is unknown and holds a head, or when the weights
    disagree with what the class has."""
    if name is None:
        return built or BACKBONE
    head = HEADS.get(("transformers", name))
    if head is None:
        if built is None:
            return BACKBONE
        raise ValueError(f"{name}: a class whose head keras_vit cannot tell as a classifier or a projection "
                         f"(it reads {', '.join(n for lib, n in HEADS if lib == 'transformers')})")
    if (head == BACKBONE) != (built is None):
        held = "no head" if built is None else f"a {built} head"
        raise ValueError(f"{name} has a {head} head by its class, but the weights hold {held}")
    return head


def timm_head(tensors):
    """The head of a timm state dict: PROJECTION for a CLIP image tower (norm_pre) whose head has a zero
    (or no) bias, CLASSIFIER for any other head, BACKBONE without one."""
    if "head.weight" not in tensors:
        return BACKBONE
    bias = tensors.get("head.bias")
    if "norm_pre.weight" in tensors and (bias is None or not bias.any()):
        return PROJECTION
    return CLASSIFIER


def default_activation(head):
    """`classifier_activation` of a model whose head is `head` (None: logits, embeddings, features)."""
    return OUTPUTS[head][1]
