"""A trained model as a product (torch): load it verified, embed and score IQ windows."""
