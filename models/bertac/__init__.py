"""BERTAC: the GAN-pretrained CNN (`bertac_cnn`) (self-contained: travels with every checkpoint)."""
