"""Stand-in for the ``torchdata`` package, so PyTorch's DataLoader suite imports loaderkit."""
