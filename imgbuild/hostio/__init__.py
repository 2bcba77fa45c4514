"""What acts on the host, apart from the pure rules and types of the level below: who is calling and acting for a
user through sudo (`host`, `acting`), what a root process believes of its own start (`rootside`), files someone
else may have put in the way and every file written whole (`regular`), bounded folder walks (`tree`), the JSON
caches (`cache`) and the docker CLI's config (`dockerconfig`)."""
