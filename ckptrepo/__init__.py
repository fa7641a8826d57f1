"""ckptrepo"""
