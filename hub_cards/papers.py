"""What a model card cites: the five papers of the zoo and the baselines they compare with."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Paper:
    """What a model card cites."""

    title: str
    authors: str
    year: int
    url: str
    bibtex: str


SPANBERT_PAPER = Paper(
    title="SpanBERT: Improving Pre-training by Representing and Predicting Spans",
    authors="Mandar Joshi, Danqi Chen, Yinhan Liu, Daniel S. Weld, Luke Zettlemoyer, Omer Levy",
    year=2020,
    url="https://arxiv.org/abs/1907.10529",
    bibtex="""@article{joshi2020spanbert,
  title={{SpanBERT}: Improving Pre-training by Representing and Predicting Spans},
  author={Joshi, Mandar and Chen, Danqi and Liu, Yinhan and Weld, Daniel S. and Zettlemoyer, Luke and Levy, Omer},
  journal={Transactions of the Association for Computational Linguistics},
  volume={8},
  pages={64--77},
  year={2020}
}""",
)


TEAMS_PAPER = Paper(
    title="Training ELECTRA Augmented with Multi-word Selection",
    authors="Jiaming Shen, Jialu Liu, Tianqi Liu, Cong Yu, Jiawei Han",
    year=2021,
    url="https://arxiv.org/abs/2106.00139",
    bibtex="""@inproceedings{shen2021teams,
  title={Training {ELECTRA} Augmented with Multi-word Selection},
  author={Shen, Jiaming and Liu, Jialu and Liu, Tianqi and Yu, Cong and Han, Jiawei},
  booktitle={Findings of the Association for Computational Linguistics: ACL-IJCNLP 2021},
  pages={2475--2486},
  year={2021}
}""",
)


ELECTRA_PAPER = Paper(
    title="ELECTRA: Pre-training Text Encoders as Discriminators Rather Than Generators",
    authors="Kevin Clark, Minh-Thang Luong, Quoc V. Le, Christopher D. Manning",
    year=2020,
    url="https://arxiv.org/abs/2003.10555",
    bibtex="""@inproceedings{clark2020electra,
  title={{ELECTRA}: Pre-training Text Encoders as Discriminators Rather Than Generators},
  author={Clark, Kevin and Luong, Minh-Thang and Le, Quoc V. and Manning, Christopher D.},
  booktitle={International Conference on Learning Representations},
  year={2020}
}""",
)


CLOZE_PAPER = Paper(
    title="Cloze-driven Pretraining of Self-attention Networks",
    authors="Alexei Baevski, Sergey Edunov, Yinhan Liu, Luke Zettlemoyer, Michael Auli",
    year=2019,
    url="https://arxiv.org/abs/1903.07785",
    bibtex="""@inproceedings{baevski2019cloze,
  title={Cloze-driven Pretraining of Self-attention Networks},
  author={Baevski, Alexei and Edunov, Sergey and Liu, Yinhan and Zettlemoyer, Luke and Auli, Michael},
  booktitle={Proceedings of EMNLP-IJCNLP},
  pages={5360--5369},
  year={2019}
}""",
)


BERTAC_PAPER = Paper(
    title="BERTAC: Enhancing Transformer-based Language Models with Adversarially Pretrained Convolutional Neural "
          "Networks",
    authors="Jong-Hoon Oh, Ryu Iida, Julien Kloetzer, Kentaro Torisawa",
    year=2021,
    url="https://aclanthology.org/2021.acl-long.164/",
    bibtex="""@inproceedings{oh2021bertac,
  title={{BERTAC}: Enhancing Transformer-based Language Models with Adversarially Pretrained Convolutional \
Neural Networks},
  author={Oh, Jong-Hoon and Iida, Ryu and Kloetzer, Julien and Torisawa, Kentaro},
  booktitle={Proceedings of ACL-IJCNLP 2021},
  pages={2103--2115},
  year={2021}
}""",
)


HIRE_PAPER = Paper(
    title="Deepening Hidden Representations from Pre-trained Language Models",
    authors="Junjie Yang, Hai Zhao",
    year=2019,
    url="https://arxiv.org/abs/1911.01940",
    bibtex="""@article{yang2019deepening,
  title={Deepening Hidden Representations from Pre-trained Language Models},
  author={Yang, Junjie and Zhao, Hai},
  journal={arXiv preprint arXiv:1911.01940},
  year={2019}
}""",
)
