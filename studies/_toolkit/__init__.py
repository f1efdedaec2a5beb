"""What the studies share: config checks (`config`), the config fields several studies declare
(`fields`), peak-memory estimates (`memory`), tables, figures and progress bars (`report`),
trained weights as an analysis input (`trained`), and the pieces of the training studies
(`training`). It never imports a study or the runner."""
