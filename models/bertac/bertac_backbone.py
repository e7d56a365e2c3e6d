"""The encoder classes that a saved BERTAC checkpoint carries with it: `model_type -> (config class, model class)`.

When the encoder is remote code (a zoo model such as SpanBERT, TEAMS or the two-tower cloze model, or any
`trust_remote_code` encoder), `BertacPreTrainedModel.save_pretrained` copies the encoder's modeling files next to
BERTAC's and rewrites this file in the saved folder to import its classes. transformers follows relative imports when
it fetches a checkpoint's code, so the encoder's code loads with BERTAC's, from a local folder or from the Hub, with
no registration by the user. Encoders built into transformers need nothing: this copy lists none.
"""

BACKBONE_CLASSES: dict[str, tuple[type, type]] = {}
