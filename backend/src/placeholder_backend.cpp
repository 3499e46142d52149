// placeholder until the backend lands
