"""The torch.compile front door: AOTAutograd glue, decompositions, the ATen importer."""
