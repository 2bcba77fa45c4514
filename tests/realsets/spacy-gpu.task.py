"""spaCy's GPU task: CuPy imports (what spacy.prefer_gpu() uses), and a text classifier trains five steps."""

import random

import cupy  # noqa: F401
import spacy
from spacy.training import Example

spacy.prefer_gpu()
nlp = spacy.blank("en")
textcat = nlp.add_pipe("textcat")
for label in ("POS", "NEG"):
    textcat.add_label(label)
data = [("good fine great", {"cats": {"POS": 1.0, "NEG": 0.0}}), ("bad awful poor", {"cats": {"POS": 0.0, "NEG": 1.0}})]
examples = [Example.from_dict(nlp.make_doc(text), cats) for text, cats in data]
optimizer = nlp.initialize(lambda: examples)
for _ in range(5):
    random.shuffle(examples)
    losses = nlp.update(examples, sgd=optimizer)
print("spacy: textcat trained", losses)
