// placeholder until the part lands; replaced by its real sources
