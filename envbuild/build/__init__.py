"""Building an image: plan, fetch, install, layers, image, manifest, outputs."""
